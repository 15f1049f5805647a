//! `#[derive(Tree)]`: makes a struct or an enum a tree whose children are its fields, in
//! declaration order, so it can be passed to `jit`, `grad` and `tree::map`.
//!
//! - A struct with named fields is a node of kind `Name` keyed by the field names; a tuple
//!   struct's children are keyed `0`, `1`, ..; a unit struct has none.
//! - An enum is a node of kind `Name::Variant` with that variant's fields, so two values of
//!   different variants have different structures (`jit` traces each variant once).
//! - A field marked `#[tree(static)]` is not a tree: it is a static value (any `Clone + Eq +
//!   Hash + Debug + Send + Sync` type) kept in the structure, as `tessera::tree::Static` is.
//! - A field whose type mentions a type parameter gets the bound it needs (`Tree`, or for a
//!   static field the static value bounds); parameters themselves get none.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Field, Fields, GenericParam, Ident, parse_macro_input, parse_quote};

#[proc_macro_derive(Tree, attributes(tree))]
pub fn derive_tree(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Whether a field carries `#[tree(static)]` (an error for any other `tree(...)` argument).
fn is_static(f: &Field) -> syn::Result<bool> {
    let mut found = false;
    for attr in f.attrs.iter().filter(|a| a.path().is_ident("tree")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("static") {
                found = true;
                Ok(())
            } else {
                Err(meta.error("the only field attribute is #[tree(static)]"))
            }
        })?;
    }
    Ok(found)
}

/// One field: how to name it in a pattern and a constructor, its key, and whether it is static.
struct FieldInfo {
    binding: Ident,
    member: Tokens,
    key: String,
    is_static: bool,
}

fn fields_of(fields: &Fields) -> syn::Result<Vec<FieldInfo>> {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (member, key) = match &f.ident {
                Some(id) => (quote!(#id), id.to_string()),
                None => {
                    let idx = syn::Index::from(i);
                    (quote!(#idx), i.to_string())
                }
            };
            Ok(FieldInfo {
                binding: format_ident!("__f{i}"),
                member,
                key,
                is_static: is_static(f)?,
            })
        })
        .collect()
}

/// The flatten expression of a node of `kind` whose fields are bound to their bindings.
fn flatten_node(kind: &str, fields: &[FieldInfo]) -> Tokens {
    let keys = fields.iter().map(|f| &f.key);
    let children = fields.iter().map(|f| {
        let b = &f.binding;
        if f.is_static {
            quote!(::tessera::tree::static_def(#b))
        } else {
            quote!(::tessera::tree::Tree::flatten_into(#b, leaves))
        }
    });
    quote! {
        ::tessera::tree::TreeDef::node(
            #kind,
            vec![#(::std::borrow::Cow::Borrowed(#keys)),*],
            vec![#(#children),*],
        )
    }
}

/// The expression, with a struct's or variant's fields bound, that appends their leaves and
/// says whether the structure is `def` (a node of `kind` keyed by the field names), comparing
/// without building a `TreeDef`.
fn flatten_if_node(kind: &str, fields: &[FieldInfo]) -> Tokens {
    let keys = fields.iter().map(|f| &f.key);
    let checks = fields.iter().enumerate().map(|(idx, f)| {
        let b = &f.binding;
        if f.is_static {
            quote!(::tessera::tree::static_is(#b, &children[#idx]))
        } else {
            quote!(::tessera::tree::Tree::flatten_if(#b, &children[#idx], leaves))
        }
    });
    quote! {
        match ::tessera::tree::node_is(def, #kind, &[#(#keys),*]) {
            ::std::option::Option::Some(children) => true #(&& #checks)*,
            ::std::option::Option::None => false,
        }
    }
}

/// The field initialisers that rebuild `fields` from `children` (a `&[TreeDef]` in scope).
fn unflatten_fields(fields: &[FieldInfo]) -> Vec<Tokens> {
    fields
        .iter()
        .enumerate()
        .map(|(idx, f)| {
            let key = &f.key;
            let member = &f.member;
            let child = quote! {
                children.get(#idx).ok_or_else(|| ::tessera::Error::Tree {
                    message: format!("{} lacks field {}", def.describe(), #key),
                    location: ::std::string::String::from("tree::unflatten"),
                })?
            };
            if f.is_static {
                quote!(#member: ::tessera::tree::static_value(#child)?)
            } else {
                quote!(#member: ::tessera::tree::Tree::unflatten_from(#child, leaves)?)
            }
        })
        .collect()
}

/// The pattern that binds every field of a struct or variant at `path`.
fn pattern(path: Tokens, fields: &[FieldInfo]) -> Tokens {
    let binds = fields.iter().map(|f| {
        let (m, b) = (&f.member, &f.binding);
        quote!(#m: #b)
    });
    quote!(#path { #(#binds),* })
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = input.ident.clone();
    // Bounds on the field types, not on the parameters: a parameter used only in a static
    // field (or a `PhantomData`) needs no `Tree` bound, and a tree field of a generic type
    // gets exactly the bound it needs.
    let mut bounds: Vec<syn::WherePredicate> = Vec::new();
    let field_types: Vec<(&syn::Type, bool)> = match &input.data {
        Data::Struct(st) => st
            .fields
            .iter()
            .map(|f| Ok((&f.ty, is_static(f)?)))
            .collect::<syn::Result<_>>()?,
        Data::Enum(e) => e
            .variants
            .iter()
            .flat_map(|v| v.fields.iter())
            .map(|f| Ok((&f.ty, is_static(f)?)))
            .collect::<syn::Result<_>>()?,
        Data::Union(_) => Vec::new(),
    };
    let generic = |ty: &syn::Type| {
        let text = quote!(#ty).to_string();
        input.generics.params.iter().any(|p| match p {
            GenericParam::Type(t) => text
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| t.ident == w),
            GenericParam::Lifetime(_) | GenericParam::Const(_) => false,
        })
    };
    for (ty, stat) in field_types {
        if !generic(ty) {
            continue;
        }
        bounds.push(if stat {
            parse_quote!(#ty: ::std::clone::Clone + ::std::cmp::Eq + ::std::hash::Hash
                + ::std::fmt::Debug + ::std::marker::Send + ::std::marker::Sync + 'static)
        } else {
            parse_quote!(#ty: ::tessera::tree::Tree)
        });
    }
    let mut generics = input.generics.clone();
    generics.make_where_clause().predicates.extend(bounds);
    let (flatten, flatten_if, unflatten) = match &input.data {
        Data::Struct(s) => {
            let fields = fields_of(&s.fields)?;
            let kind = name.to_string();
            let pat = pattern(quote!(#name), &fields);
            let node = flatten_node(&kind, &fields);
            let matches = flatten_if_node(&kind, &fields);
            let inits = unflatten_fields(&fields);
            (
                quote! {
                    let #pat = self;
                    #node
                },
                quote! {
                    let #pat = self;
                    #matches
                },
                quote! {
                    let children = def.children_of(#kind)?;
                    Ok(#name { #(#inits),* })
                },
            )
        }
        Data::Enum(e) => {
            let mut flat_arms = Vec::new();
            let mut if_arms = Vec::new();
            let mut kinds = Vec::new();
            let mut builds = Vec::new();
            for v in &e.variants {
                let vname = &v.ident;
                let fields = fields_of(&v.fields)?;
                let kind = format!("{name}::{vname}");
                let pat = pattern(quote!(#name::#vname), &fields);
                let node = flatten_node(&kind, &fields);
                flat_arms.push(quote!(#pat => #node));
                let matches = flatten_if_node(&kind, &fields);
                if_arms.push(quote!(#pat => #matches));
                let inits = unflatten_fields(&fields);
                builds.push(quote! {
                    if let Ok(children) = def.children_of(#kind) {
                        return Ok(#name::#vname { #(#inits),* });
                    }
                });
                kinds.push(kind);
            }
            let expected = kinds.join(" or ");
            (
                if flat_arms.is_empty() {
                    // No variant: no value exists, and `*self` matches nothing.
                    quote!(match *self {})
                } else {
                    quote!(match self { #(#flat_arms),* })
                },
                if if_arms.is_empty() {
                    quote!(match *self {})
                } else {
                    quote!(match self { #(#if_arms),* })
                },
                quote! {
                    #(#builds)*
                    Err(::tessera::Error::Tree {
                        message: format!("expected {}, found {}", #expected, def.describe()),
                        location: ::std::string::String::from("tree::unflatten"),
                    })
                },
            )
        }
        Data::Union(_) => {
            return Err(syn::Error::new_spanned(
                &name,
                "#[derive(Tree)] supports structs and enums, not unions",
            ));
        }
    };
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::tessera::tree::Tree for #name #ty_generics #where_clause {
            #[allow(unused_variables)]
            fn flatten_into(&self, leaves: &mut ::std::vec::Vec<::tessera::Tensor>) -> ::tessera::tree::TreeDef {
                #flatten
            }
            #[allow(unused_variables)]
            fn flatten_if(
                &self,
                def: &::tessera::tree::TreeDef,
                leaves: &mut ::std::vec::Vec<::tessera::Tensor>,
            ) -> bool {
                #flatten_if
            }
            #[allow(unused_variables)]
            fn unflatten_from(
                def: &::tessera::tree::TreeDef,
                leaves: &mut ::tessera::tree::Leaves<'_>,
            ) -> ::tessera::Result<Self> {
                #unflatten
            }
        }
    })
}

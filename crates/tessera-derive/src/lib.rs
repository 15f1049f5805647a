//! `#[derive(Tree)]`: makes a struct with named fields a tree whose children are its fields, in
//! declaration order, so it can be passed to `jit`, `grad` and `tree::map`.

use proc_macro::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, parse_macro_input};

#[proc_macro_derive(Tree)]
pub fn derive_tree(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    let name = &input.ident;
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => f
                .named
                .iter()
                .map(|f| f.ident.clone().unwrap())
                .collect::<Vec<_>>(),
            _ => {
                return syn::Error::new_spanned(
                    name,
                    "#[derive(Tree)] needs a struct with named fields",
                )
                .to_compile_error()
                .into();
            }
        },
        _ => {
            return syn::Error::new_spanned(name, "#[derive(Tree)] supports structs only")
                .to_compile_error()
                .into();
        }
    };
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let kind = name.to_string();
    let keys: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
    let idx: Vec<usize> = (0..fields.len()).collect();
    let expanded = quote! {
        impl #impl_generics ::tessera::tree::Tree for #name #ty_generics #where_clause {
            fn flatten_into(&self, leaves: &mut ::std::vec::Vec<::tessera::Tensor>) -> ::tessera::tree::TreeDef {
                ::tessera::tree::TreeDef::node(
                    #kind,
                    vec![#(::std::string::String::from(#keys)),*],
                    vec![#(::tessera::tree::Tree::flatten_into(&self.#fields, leaves)),*],
                )
            }
            fn unflatten_from(
                def: &::tessera::tree::TreeDef,
                leaves: &mut ::std::vec::IntoIter<::tessera::Tensor>,
            ) -> ::tessera::Result<Self> {
                let children = def.children_of(#kind)?;
                Ok(#name {
                    #(#fields: ::tessera::tree::Tree::unflatten_from(
                        children.get(#idx).ok_or_else(|| ::tessera::Error::Tree {
                            message: format!("{} lacks field {}", def.describe(), #keys),
                            location: ::std::string::String::from("tree::unflatten"),
                        })?,
                        leaves,
                    )?),*
                })
            }
        }
    };
    expanded.into()
}

//! Host tensor values: the payload of `constant` ops, the interpreter's values and the
//! runtime's buffers. Row-major, one `Vec` per element type.

use crate::types::{DType, Shape, TensorType};

/// Elements of a tensor, row-major.
#[derive(Clone, Debug)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    Bool(Vec<bool>),
}

impl Data {
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::I32(_) => DType::I32,
            Data::U32(_) => DType::U32,
            Data::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` copies of zero (false for bool).
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::U32 => Data::U32(vec![0; n]),
            DType::Bool => Data::Bool(vec![false; n]),
        }
    }

    /// `n` copies of zero, or an error naming the size when the allocation fails (instead of
    /// aborting the process). The memory is written, so it is really there.
    pub fn try_zeros(dtype: DType, n: usize) -> Result<Data, String> {
        Data::try_splat(dtype, 0.0, n)
    }

    /// `n` copies of `x` converted to `dtype`, or an error naming the size when the
    /// allocation fails.
    pub fn try_splat(dtype: DType, x: f64, n: usize) -> Result<Data, String> {
        fn fill<T: Clone>(x: T, n: usize, width: usize) -> Result<Vec<T>, String> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                format!(
                    "cannot allocate {} bytes ({n} elements of {width} bytes)",
                    n.saturating_mul(width)
                )
            })?;
            v.resize(n, x);
            Ok(v)
        }
        let w = dtype.byte_width();
        Ok(match dtype {
            DType::F32 => Data::F32(fill(x as f32, n, w)?),
            DType::F64 => Data::F64(fill(x, n, w)?),
            DType::I32 => Data::I32(fill(x as i32, n, w)?),
            DType::U32 => Data::U32(fill(x as u32, n, w)?),
            DType::Bool => Data::Bool(fill(x != 0.0, n, w)?),
        })
    }

    /// Element `i` as f64 (bool as 0 or 1): for printing and tests, not for kernels.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F64(v) => v[i],
            Data::I32(v) => v[i] as f64,
            Data::U32(v) => v[i] as f64,
            Data::Bool(v) => v[i] as u8 as f64,
        }
    }

    /// `n` copies of `x` converted to `dtype` the way `convert` does.
    pub fn splat(dtype: DType, x: f64, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![x as f32; n]),
            DType::F64 => Data::F64(vec![x; n]),
            DType::I32 => Data::I32(vec![x as i32; n]),
            DType::U32 => Data::U32(vec![x as u32; n]),
            DType::Bool => Data::Bool(vec![x != 0.0; n]),
        }
    }

    /// Bitwise equality, so that NaN constants compare equal to themselves.
    pub fn bits_eq(&self, other: &Data) -> bool {
        match (self, other) {
            (Data::F32(a), Data::F32(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Data::F64(a), Data::F64(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Data::I32(a), Data::I32(b)) => a == b,
            (Data::U32(a), Data::U32(b)) => a == b,
            (Data::Bool(a), Data::Bool(b)) => a == b,
            _ => false,
        }
    }

    /// True when every element equals the first (bitwise).
    pub fn is_splat(&self) -> bool {
        match self {
            Data::F32(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
            Data::F64(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
            Data::I32(v) => v.iter().all(|x| *x == v[0]),
            Data::U32(v) => v.iter().all(|x| *x == v[0]),
            Data::Bool(v) => v.iter().all(|x| *x == v[0]),
        }
    }

    /// Element `i` in the IR text syntax; floats print the shortest text that parses back to the
    /// same bits (non-finite values print as `nan`, `inf`, `-inf`).
    pub fn element_text(&self, i: usize) -> String {
        fn float(x: f64, text: String) -> String {
            if x.is_nan() {
                "nan".into()
            } else if x.is_infinite() {
                if x > 0.0 { "inf".into() } else { "-inf".into() }
            } else {
                text
            }
        }
        match self {
            Data::F32(v) => float(v[i] as f64, format!("{:?}", v[i])),
            Data::F64(v) => float(v[i], format!("{:?}", v[i])),
            Data::I32(v) => v[i].to_string(),
            Data::U32(v) => v[i].to_string(),
            Data::Bool(v) => v[i].to_string(),
        }
    }
}

/// A host tensor: a type and its row-major elements.
#[derive(Clone, Debug)]
pub struct Literal {
    pub ty: TensorType,
    pub data: Data,
}

impl PartialEq for Literal {
    fn eq(&self, other: &Literal) -> bool {
        self.ty == other.ty && self.data.bits_eq(&other.data)
    }
}

impl Literal {
    /// A literal from its elements; `None` when the count does not match the shape or the
    /// shape is over the size limit ([`TensorType::check_size`]).
    pub fn new(shape: impl Into<Shape>, data: Data) -> Option<Literal> {
        let lit = Literal {
            ty: TensorType::new(data.dtype(), shape.into()),
            data,
        };
        lit.check().is_ok().then_some(lit)
    }

    /// Checks that the data is what the type declares: the type is within the size limit, the
    /// data has the declared element type and exactly as many elements as the shape.
    pub fn check(&self) -> Result<(), String> {
        self.ty.check_size()?;
        if self.data.dtype() != self.ty.dtype {
            return Err(format!(
                "a literal declared {} holds {} data",
                self.ty,
                self.data.dtype()
            ));
        }
        if self.data.len() != self.ty.numel() {
            return Err(format!(
                "a literal declared {} ({} elements) holds {} elements",
                self.ty,
                self.ty.numel(),
                self.data.len()
            ));
        }
        Ok(())
    }

    /// Zeros of type `ty`, or an error when `ty` is over the size limit or the memory cannot
    /// be allocated.
    pub fn try_zeros(ty: &TensorType) -> Result<Literal, String> {
        Literal::try_splat(ty, 0.0)
    }

    /// `x` converted to `ty`'s dtype at every element, or an error when `ty` is over the size
    /// limit or the memory cannot be allocated.
    pub fn try_splat(ty: &TensorType, x: f64) -> Result<Literal, String> {
        ty.check_size()?;
        let data = Data::try_splat(ty.dtype, x, ty.numel()).map_err(|e| format!("{ty}: {e}"))?;
        Ok(Literal {
            ty: ty.clone(),
            data,
        })
    }

    pub fn zeros(ty: &TensorType) -> Literal {
        Literal {
            ty: ty.clone(),
            data: Data::zeros(ty.dtype, ty.numel()),
        }
    }

    pub fn splat(ty: &TensorType, x: f64) -> Literal {
        Literal {
            ty: ty.clone(),
            data: Data::splat(ty.dtype, x, ty.numel()),
        }
    }

    pub fn scalar_f32(x: f32) -> Literal {
        Literal {
            ty: TensorType::scalar(DType::F32),
            data: Data::F32(vec![x]),
        }
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }

    /// Every element as f64, for tests and printing.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.data.len()).map(|i| self.data.get_f64(i)).collect()
    }
}

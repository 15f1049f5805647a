//! Compile time against program size (issue 14): the first call of a jit of a `concatenate`
//! of N scaled copies (`concat N`), of a chain of N tanh layers and its gradient (`chain N`),
//! and of the gradient through N 8x8 matmul+tanh layers (`mlp N`); `shapes N` calls one jit on
//! N shapes and prints the resident memory (the jit cache is bounded). With `TESSERA_TIMING=1`
//! each compilation prints its per-pass table.
//!
//! Run: `TESSERA_TIMING=1 cargo run --release --example compile_scaling -- concat 5000`
use std::time::Instant;
use tessera::prelude::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(which), Some(n)) = (
        args.get(1),
        args.get(2).and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: compile_scaling concat|chain|mlp|shapes N");
        std::process::exit(2);
    };
    let which = which.as_str();
    match which {
        "concat" => {
            let f = jit(move |x: Tensor| {
                let parts: Vec<Tensor> = (0..n).map(|i| &x * (i as f32)).collect();
                let refs: Vec<&Tensor> = parts.iter().collect();
                Tensor::concatenate(&refs, 0)
            });
            let t = Instant::now();
            f.call(Tensor::ones([2])).unwrap();
            println!("concat {n}: {:.3} s", t.elapsed().as_secs_f64());
        }
        "chain" => {
            let f = jit(move |x: Tensor| {
                let mut h = x.clone();
                for _ in 0..n {
                    h = (&h * 1.01).tanh();
                }
                h.sum()
            });
            let t = Instant::now();
            f.call(Tensor::ones([4])).unwrap();
            println!("chain fwd {n}: {:.3} s", t.elapsed().as_secs_f64());
            let g = jit(move |x: Tensor| {
                grad(|x: &Tensor| {
                    let mut h = x.clone();
                    for _ in 0..n {
                        h = (&h * 1.01).tanh();
                    }
                    h.sum()
                })(&x)
            });
            let t = Instant::now();
            g.call(Tensor::ones([4])).unwrap();
            println!("chain grad {n}: {:.3} s", t.elapsed().as_secs_f64());
        }
        "mlp" => {
            let ws: Vec<Tensor> = (0..n)
                .map(|i| random::normal(&Key::new(i as i64), [8, 8]) * 0.3)
                .collect();
            let g = jit(move |(ws, x): (Vec<Tensor>, Tensor)| {
                grad(|ws: &Vec<Tensor>| {
                    let mut h = x.clone();
                    for w in ws {
                        h = h.matmul(w).tanh();
                    }
                    h.sum()
                })(&ws)
            });
            let t = Instant::now();
            g.call((ws.clone(), Tensor::ones([4, 8]))).unwrap();
            println!("mlp grad {n}: {:.3} s", t.elapsed().as_secs_f64());
        }
        "shapes" => {
            // One jit called on N shapes: the bounded cache keeps resident memory flat.
            let rss = || {
                std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmRSS:"))
                            .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
                    })
                    .unwrap_or_default()
            };
            let f = jit(|x: Tensor| (&x * 2.0 + 1.0).tanh());
            f.call(Tensor::ones([1])).unwrap();
            let before = rss();
            for k in 1..=n {
                f.call(Tensor::ones([k])).unwrap();
            }
            println!(
                "shapes {n}: VmRSS {before} kB after one shape, {} kB after {n}; {} programs kept",
                rss(),
                f.cache_len()
            );
        }
        other => {
            eprintln!("unknown workload {other}: concat, chain, mlp or shapes");
            std::process::exit(2);
        }
    }
}

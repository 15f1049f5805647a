#[path = "data_parallel_pmap.rs"]
#[allow(dead_code)]
mod dp;
#[path = "data_parallel_sharding.rs"]
#[allow(dead_code)]
mod sh;
#[path = "train_single.rs"]
#[allow(dead_code)]
mod ts;
fn main() {
    let b = tessera::Backend::Interpreter;
    let f = |l: Vec<f32>| {
        l.iter()
            .step_by(10)
            .map(|x| format!("{:08x}", x.to_bits()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("pmap1  {}", f(dp::train(1, 41, b).unwrap()));
    println!("pmap8  {}", f(dp::train(8, 41, b).unwrap()));
    println!("single {}", f(ts::train(41, b).unwrap()));
    println!("shard8 {}", f(sh::train(41, b).unwrap().0));
}

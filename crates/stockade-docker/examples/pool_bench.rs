//! Warm-pool exec round trips, for `cargo xtask bench docker`: prints one JSON line with the
//! p50 and p90 (milliseconds) of 40 runs of `true`, in a persistent session and in a pool
//! that replaces each container after its run (paced so that replacement keeps up, as it
//! would between an agent's tool calls), and of 20 one-shot runs through the same client.
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on broken setup")]

use std::time::{Duration, Instant};

use stockade_docker::DockerTier;
use stockade_docker::pool::{DockerPool, PoolConfig};
use stockade_docker::spec::DEFAULT_IMAGE;
use stockade_protocol::Job;

fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], ms[ms.len() * 9 / 10])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tier = DockerTier::connect().await.unwrap();
    let job = Job::image(DEFAULT_IMAGE, ["true"]).unwrap();
    let mut out = serde_json::Map::new();
    for (label, persistent, pause) in
        [("session", true, Duration::ZERO), ("recycled", false, Duration::from_millis(400))]
    {
        let mut config = PoolConfig::new(2, DEFAULT_IMAGE);
        config.persistent = persistent;
        let pool = DockerPool::new(tier.clone(), config).await.unwrap();
        let mut ms = Vec::new();
        for i in 0..42 {
            tokio::time::sleep(pause).await;
            let t = Instant::now();
            let r = pool.run(&job).await.unwrap();
            assert!(matches!(r.status, stockade_protocol::Status::Exited { code: 0 }), "{r:?}");
            if i >= 2 {
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        pool.shutdown().await;
        let (p50, p90) = percentiles(ms);
        out.insert(label.into(), serde_json::json!({"p50": p50, "p90": p90}));
    }
    let mut ms = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        tier.run(&job).await.unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (p50, p90) = percentiles(ms);
    out.insert("one_shot_in_process".into(), serde_json::json!({"p50": p50, "p90": p90}));
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("{}", serde_json::Value::Object(out));
}

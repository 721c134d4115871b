//! `stockade-mock-llm SCRIPT.json`: serves a scripted OpenAI-compatible endpoint on
//! 127.0.0.1 for walking `stockade agent` by hand. The script is a JSON array of completion
//! bodies, answered in order; the base URL is printed on stdout. Stops on Ctrl-C.

use std::io::Write;

fn main() -> std::io::Result<()> {
    let path = std::env::args().nth(1).ok_or_else(|| std::io::Error::other("usage: stockade-mock-llm SCRIPT.json"))?;
    let text = std::fs::read(&path)?;
    let script: Vec<serde_json::Value> = serde_json::from_slice(&text).map_err(std::io::Error::other)?;
    let mock = stockade_test_support::MockLlm::script(script.iter().map(stockade_test_support::Reply::json).collect())?;
    writeln!(std::io::stdout(), "{}", mock.url())?;
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

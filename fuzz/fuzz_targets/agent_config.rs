//! The agent's configuration loader (`agent.toml`): arbitrary text must never panic it; an
//! error's position is inside the text; a loaded configuration's tools have unique names
//! and a program to run.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stockade_agent::config::AgentConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match AgentConfig::parse(text, Path::new("/fuzz/agent.toml")) {
        Ok(config) => {
            let mut names = HashSet::new();
            for c in &config.commands {
                assert!(!c.argv.is_empty() && !c.argv[0].is_empty(), "a command tool without a program");
                assert!(names.insert(c.def.name().to_owned()), "duplicate tool {}", c.def.name());
            }
        }
        Err(e) => {
            if let Some((line, col)) = e.at {
                assert!(line >= 1 && col >= 1);
                assert!(line <= text.split('\n').count(), "line {line} past the end");
            }
            let _ = e.to_string();
        }
    }
});

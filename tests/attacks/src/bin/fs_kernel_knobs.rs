//! Write kernel knobs under /proc.
//! Catalogue row: 13 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("core_pattern", std::fs::write("/proc/sys/kernel/core_pattern", "|/tmp/evil"));
    report("sysrq", std::fs::write("/proc/sysrq-trigger", "h"));
}

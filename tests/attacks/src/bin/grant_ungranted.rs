//! Call a function the run was not granted, a granted one with arguments its policy denies,
//! one with arguments outside its schema, and reserved or malformed names.
//! Grants row (issue 12): the host's side-effect log must stay empty.
use stockade_attacks::*;

fn main() {
    let mut s = match broker(None) {
        Ok(s) => s,
        Err(e) => return report("connect", Err::<(), _>(e)),
    };
    report_grant("ungranted_function", grant_call(&mut s, "send", r#"{"to":"anyone"}"#));
    report_grant("denied_arguments", grant_call(&mut s, "log", r#"{"msg":"pwned"}"#));
    report_grant("extra_argument", grant_call(&mut s, "log", r#"{"msg":"ok-a","path":"/etc"}"#));
    report_grant("wrong_type", grant_call(&mut s, "log", r#"{"msg":7}"#));
    report_grant("not_an_object", grant_call(&mut s, "log", r#"["ok-a"]"#));
    report_grant("reserved_name", grant_call(&mut s, "stockade.admin", "{}"));
}

//! agent.toml: checked at load, with the line and column in every error.

use std::path::Path;
use std::time::Duration;

use stockade_agent::AgentConfig;

fn load(text: &str) -> Result<AgentConfig, String> {
    AgentConfig::parse(text, Path::new("/etc/stockade/agent.toml")).map_err(|e| e.to_string())
}

#[test]
fn the_shipped_steward_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/steward/agent.toml");
    let c = AgentConfig::load_ambient(&path).unwrap();
    assert_eq!(c.agent.max_turns, Some(12));
    let names: Vec<&str> = c.commands.iter().map(|t| t.def.name()).collect();
    assert_eq!(names, ["read_scroll", "read_ledger", "send_raven"]);
    assert!(c.run_code.is_some());
    assert!(c.policy_text_ambient().unwrap().unwrap().contains("ravens-to-allies"));
}

#[test]
fn errors_name_line_and_column() {
    let cases = [
        ("[endpoint]\nbase_url = 3\n", "agent.toml:2:12: invalid type"),
        ("[endpoint]\nmodle = \"x\"\n", "agent.toml:2:1: unknown field `modle`"),
        ("[agent]\ndeadline = \"soon\"\n", "agent.toml:2:12: invalid duration \"soon\""),
        ("[[tool]]\nname = \"t\"\n", "agent.toml:1:1: tool 1 (t): a command tool needs command"),
        (
            "[[tool]]\nname = \"t\"\ncommand = [\"x\"]\noutput = \"maybe\"\n",
            "agent.toml:1:1: tool 1 (t): output must be",
        ),
        (
            "\n[[tool]]\nbuiltin = \"run_code\"\nlanguages = [\"ruby\"]\n",
            "agent.toml:2:1: tool 1 (run_code): unknown language \"ruby\"",
        ),
        (
            "[[tool]]\nname = \"bad name\"\ncommand = [\"x\"]\noutput = \"trusted\"\n",
            "tool 1 (bad name): the name must be",
        ),
        (
            "[[tool]]\nname = \"t\"\ncommand = [\"x\"]\noutput = \"trusted\"\n[[tool]]\nname = \"t\"\ncommand = [\"y\"]\noutput = \"trusted\"\n",
            "agent.toml:5:1: tool 2 (t): a tool of this name is defined twice",
        ),
        (
            "[[tool]]\nname = \"t\"\ncommand = [\"x\"]\noutput = \"trusted\"\nparameters = { type = \"object\", properties = { a = { type = \"date\" } } }\n",
            "unsupported type \"date\"",
        ),
    ];
    for (text, want) in cases {
        let got = load(text).unwrap_err();
        assert!(got.contains(want), "{text:?}: got {got:?}, want {want:?}");
    }
}

#[test]
fn relative_paths_resolve_beside_the_config() {
    let c = load("[agent]\npolicy = \"p.toml\"\ndeadline = \"90s\"\n[[tool]]\nname = \"t\"\ncommand = [\"./bin/t\", \"--flag\"]\noutput = \"trusted\"\n").unwrap();
    assert_eq!(c.agent.policy.as_deref(), Some(Path::new("/etc/stockade/p.toml")));
    assert_eq!(c.agent.deadline, Some(Duration::from_secs(90)));
    assert_eq!(c.commands[0].argv, ["/etc/stockade/./bin/t", "--flag"]);
}

#[test]
fn allow_net_is_checked_at_load_and_needs_a_confined_command() {
    let c = load("[[tool]]\nbuiltin = \"run_code\"\nallow_net = [\"pypi.org\", \"*.pythonhosted.org:443\"]\n").unwrap();
    assert_eq!(c.run_code.unwrap().allow_net, ["pypi.org", "*.pythonhosted.org:443"]);
    let bad = load("[[tool]]\nbuiltin = \"run_code\"\nallow_net = [\"http://pypi.org\"]\n").unwrap_err();
    assert!(bad.contains("agent.toml:1:1: tool 1 (run_code): --allow-net \"http://pypi.org\""), "{bad}");
    let cmd = load("[[tool]]\nname = \"t\"\ncommand = [\"x\"]\noutput = \"trusted\"\nallow_net = [\"pypi.org\"]\n")
        .unwrap_err();
    assert!(cmd.contains("allow_net needs confine = \"process\""), "{cmd}");
    let confined =
        load("[[tool]]\nname = \"t\"\ncommand = [\"x\"]\noutput = \"trusted\"\nconfine = \"process\"\nallow_net = [\"pypi.org\"]\n")
            .unwrap();
    assert_eq!(confined.commands[0].allow_net, ["pypi.org"]);
}

#[test]
fn grant_mcp_needs_run_code_a_policy_and_a_command() {
    const RUN_CODE: &str = "[[tool]]\nbuiltin = \"run_code\"\n";
    let ok = load(&format!(
        "[grant]\npolicy = \"grants.toml\"\n[[grant.mcp]]\nname = \"desk\"\ncommand = [\"python3\", \"desk.py\"]\nenv = [\"DESK_LOG\"]\n{RUN_CODE}"
    ))
    .unwrap();
    assert_eq!(ok.grants.policy.as_deref(), Some(Path::new("/etc/stockade/grants.toml")));
    assert_eq!(
        (ok.grants.mcp[0].name.as_str(), ok.grants.mcp[0].env.as_slice()),
        ("desk", &["DESK_LOG".to_owned()][..])
    );
    // Loaded either way; an agent whose loop runs on the host needs run_code and a policy.
    assert!(ok.check_unconfined().is_ok());
    for (text, expected) in [
        ("[[grant.mcp]]\nname = \"desk\"\ncommand = [\"x\"]\n".to_owned(), "add the built-in run_code"),
        (format!("[[grant.mcp]]\nname = \"desk\"\ncommand = [\"x\"]\n{RUN_CODE}"), "needs [grant] policy"),
    ] {
        let e = load(&text).unwrap().check_unconfined().unwrap_err();
        assert!(e.contains(expected), "{text}: {e}");
    }
    let cases: [(&str, &str); 5] = [
        (
            &format!("[grant]\npolicy = \"g.toml\"\n[[grant.mcp]]\nname = \"desk\"\ncommand = []\n{RUN_CODE}"),
            "needs command",
        ),
        (
            &format!("[grant]\npolicy = \"g.toml\"\n[[grant.mcp]]\nname = \"a.b\"\ncommand = [\"x\"]\n{RUN_CODE}"),
            "invalid MCP server name",
        ),
        (
            &format!(
                "[grant]\npolicy = \"g.toml\"\n[[grant.mcp]]\nname = \"d\"\ncommand = [\"x\"]\n[[grant.mcp]]\nname = \"d\"\ncommand = [\"y\"]\n{RUN_CODE}"
            ),
            "defined twice",
        ),
        (&format!("[grant]\npolicy = \"g.toml\"\n{RUN_CODE}"), "nothing is granted"),
        ("[[grant.mcp]]\nname = \"d\"\ncommand = [\"x\"]\nargs = 1\n", "unknown field `args`"),
    ];
    for (text, expected) in cases {
        let e = load(text).unwrap_err();
        assert!(e.contains(expected), "{text}: {e}");
    }
}

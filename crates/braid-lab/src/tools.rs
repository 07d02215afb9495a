//! Outside programs the lab runs, checked before anything starts, each named with the
//! Debian package that has it, so a missing tool is reported as such and not as a
//! failure further on (e.g. "no ping through the tunnel" when `ping` is not installed).

use std::path::{Path, PathBuf};

/// A program the lab needs, and the Debian package that installs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// Command name.
    pub cmd: &'static str,
    /// Debian package.
    pub package: &'static str,
}

/// What `braid lab up` runs.
pub const LAB_UP: &[Tool] = &[
    Tool {
        cmd: "ip",
        package: "iproute2",
    },
    Tool {
        cmd: "tc",
        package: "iproute2",
    },
];

/// What `braid lab bench` runs besides `LAB_UP`; `mptcpize` only with MPTCP.
pub const LAB_BENCH: &[Tool] = &[
    Tool {
        cmd: "ping",
        package: "iputils-ping",
    },
    Tool {
        cmd: "iperf3",
        package: "iperf3",
    },
];

/// MPTCP's wrapper.
pub const MPTCPIZE: Tool = Tool {
    cmd: "mptcpize",
    package: "mptcpize",
};

/// Where `cmd` is on `PATH` (or `cmd` itself if it is a path to an executable file).
pub fn find(cmd: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| executable(p))
}

/// The tools of `tools` that are missing, as one message naming the packages to
/// install; `None` when all are there.
pub fn missing(tools: &[Tool]) -> Option<String> {
    let gone: Vec<&Tool> = tools.iter().filter(|t| find(t.cmd).is_none()).collect();
    if gone.is_empty() {
        return None;
    }
    let cmds: Vec<&str> = gone.iter().map(|t| t.cmd).collect();
    let mut pkgs: Vec<&str> = gone.iter().map(|t| t.package).collect();
    pkgs.dedup();
    Some(format!(
        "{} not installed: apt-get install {}",
        cmds.join(", "),
        pkgs.join(" ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_is_there_and_names_the_package_of_what_is_not() {
        assert!(find("sh").is_some());
        assert!(find("/bin/sh").is_some());
        assert!(find("braid-no-such-tool").is_none());
        let tools = [
            Tool {
                cmd: "sh",
                package: "dash",
            },
            Tool {
                cmd: "braid-no-such-tool",
                package: "braid-tools",
            },
        ];
        let m = missing(&tools).unwrap();
        assert!(
            m.contains("braid-no-such-tool") && m.contains("apt-get install braid-tools"),
            "{m}"
        );
        assert!(!m.contains("dash"));
        assert_eq!(missing(&tools[..1]), None);
    }
}

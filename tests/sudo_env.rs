//! `sudo VAR=value COMMAND` in a debian guest, as a user types it: the assignments set the
//! command's environment (over root's HOME and PATH too), a name sudo would not take is
//! refused with the reason, and nothing set this way outlives the command. Options are read
//! as sudo's getopt reads them, and `sudo -s` hands its shell each word whole.

use dynocap_e2e::images::{debian_home, require_mmdebstrap};
use dynocap_e2e::require_root;

#[test]
fn sudo_takes_assignments_before_the_command() {
    if !(require_root("sudo_takes_assignments_before_the_command")
        && require_mmdebstrap("sudo_takes_assignments_before_the_command"))
    {
        return;
    }
    let (home, _) = debian_home();
    home.sandbox("env", &["--image", "debian"]);
    assert_eq!(
        home.sh(
            "env",
            "sudo A=1 B='two words' C= D=x=y sh -c 'echo \"$A|$B|${C-unset}|$D|$(id -u)\"'"
        ),
        "1|two words||x=y|0\n"
    );
    // The issue's own command line: apt's frontend variable reaches dpkg's configuration.
    assert_eq!(
        home.sh(
            "env",
            "sudo DEBIAN_FRONTEND=noninteractive env | grep -E '^(DEBIAN_FRONTEND|HOME|USER)=' | sort"
        ),
        "DEBIAN_FRONTEND=noninteractive\nHOME=/root\nUSER=root\n"
    );
    // Without a terminal debconf falls back from its dialog frontend, and says so; told
    // noninteractive, it does not try.
    let dialog = home.exec("env", &[], "sudo dpkg-reconfigure tzdata");
    assert!(
        dialog["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("unable to initialize frontend")),
        "{dialog:#}"
    );
    let quiet = home.exec(
        "env",
        &[],
        "sudo DEBIAN_FRONTEND=noninteractive dpkg-reconfigure tzdata",
    );
    assert_eq!(quiet["exitCode"], 0, "{quiet:#}");
    assert!(
        quiet["stderr"]
            .as_str()
            .is_some_and(|e| !e.contains("frontend") && e.contains("time zone")),
        "{quiet:#}"
    );
    // Over root's own settings, and after `--` and `-E` as in sudo.
    assert_eq!(
        home.sh(
            "env",
            "sudo -E -- HOME=/srv PATH=/usr/bin:/bin sh -c 'echo $HOME $PATH'"
        ),
        "/srv /usr/bin:/bin\n"
    );
    // -E and --preserve-env keep the caller's environment (it is always kept).
    assert_eq!(
        home.sh(
            "env",
            "X=kept sudo -E sh -c 'echo $X'; X=too sudo --preserve-env=X sh -c 'echo $X'"
        ),
        "kept\ntoo\n"
    );
    // A word starting with `=` is a command, as in sudo; a bad name is refused, not run.
    for (command, message) in [
        (
            "sudo 1A=b touch /ran",
            "sudo: \"1A\" is not a valid environment variable name: in VAR=value, VAR is ASCII \
             letters, digits and underscores, not starting with a digit\n",
        ),
        (
            "sudo A=1 B-C=2 touch /ran",
            "sudo: \"B-C\" is not a valid environment variable name: in VAR=value, VAR is ASCII \
             letters, digits and underscores, not starting with a digit\n",
        ),
        ("sudo A=1", "usage: sudo [VAR=value...] COMMAND [ARG...]\n"),
    ] {
        let refused = home.exec("env", &[], command);
        assert_eq!(refused["exitCode"], 1, "{command}: {refused:#}");
        assert_eq!(refused["stderr"], message, "{command}");
    }
    assert_eq!(
        home.sh("env", "test -e /ran || echo never-ran"),
        "never-ran\n"
    );
    // What a command sets for itself stays its own: a preload the loader cannot find only
    // warns that command, and the broker, the next sudo and plain commands are as before.
    let preloaded = home.exec("env", &[], "sudo LD_PRELOAD=/nonexistent.so A=1 true");
    assert_eq!(preloaded["exitCode"], 0, "{preloaded:#}");
    assert_eq!(
        home.sh(
            "env",
            "sudo sh -c 'echo ${LD_PRELOAD-none} ${A-unset}'; echo ${A-unset}"
        ),
        "none unset\nunset\n"
    );
    assert_eq!(home.sh("env", "sudo id -u"), "0\n");
    // Options as sudo's getopt reads them: clustered, attached, long with `=`; `-k` with a
    // command runs it (it only forgets cached credentials, and there are none).
    assert_eq!(
        home.sh(
            "env",
            "sudo -nE id -u; sudo -uroot id -u; sudo --user=root id -u; sudo -k id -u"
        ),
        "0\n0\n0\n0\n"
    );
    let validate = home.exec("env", &[], "sudo -v touch /ran");
    assert_eq!(validate["exitCode"], 1, "{validate:#}");
    assert_eq!(validate["stderr"], "sudo: -v takes no command\n");
    // `sudo -s` hands the shell each word whole, escaped as sudo escapes it: one file named
    // with a space, and a `;` that is an argument, not a second command.
    assert_eq!(
        home.sh(
            "env",
            "cd /tmp && sudo -s touch 'a b' && ls -1 /tmp | grep -c '^a b$'; \
             sudo -s echo 'x;' 'id -u' '$HOME'"
        ),
        "1\nx; id -u /root\n"
    );
    // -u naming the caller (by name or id) runs the command as the caller, assignments and
    // all, as sudo does; another user is refused, naming who is available.
    let me = home.sh("env", "id -un; id -u");
    assert_eq!(
        home.sh(
            "env",
            "sudo -u \"$(id -un)\" A=1 sh -c 'echo $A $(id -u)'; sudo -u \"#$(id -u)\" id -un"
        ),
        format!(
            "1 {}\n{}\n",
            me.lines().nth(1).expect("uid"),
            me.lines().next().expect("name")
        )
    );
    let other = home.exec("env", &[], "sudo -u nobody id");
    assert_eq!(other["exitCode"], 1, "{other:#}");
    assert!(
        other["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("only root (and you)") && e.contains("nobody")),
        "{other:#}"
    );
}

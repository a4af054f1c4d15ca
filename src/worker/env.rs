//! The environment of a job's child process, decided in one place.
//!
//! A child inherits nothing by itself (the process is spawned with `env_clear`): what it gets is
//! built here. A Redis URL such as `redis://:${REDIS_PASSWORD}@…` needs the password in the worker's
//! environment, and a child that simply inherited that environment would get the lock store's password
//! — any job could print it into the logs or write to the lock keys. So the store's variables are never
//! inherited (a job whose `env` names one still gets it), and `inherit_env` chooses what else a job
//! takes from the worker: everything, nothing, or a list of names.
//!
//! Nor may a job read the worker's own environment (or memory) through `/proc/<worker pid>/environ`,
//! which a process of the same user may by default: [`hide_from_jobs`] marks the worker not dumpable, so
//! those files are the kernel's (root's) and closed to anyone without `CAP_SYS_PTRACE`. The flag is reset
//! in a child at its `execve`, so jobs are not affected, and it does not change what the worker itself
//! may read of other processes (the orphans' `environ`, see `process::reaper`).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

use crate::config::InheritEnv;

/// The child's whole environment, in this order, later entries replacing earlier ones of the same name:
/// the part of `worker_env` that `inherit` selects, less `secret_env_vars`; then the job's `job_env`;
/// then `redcron` (the `REDCRON_*` variables of the run). Sorted by name, each name once.
pub(crate) fn job_environment(
    worker_env: &[(OsString, OsString)],
    inherit: &InheritEnv,
    secret_env_vars: &BTreeSet<String>,
    job_env: &BTreeMap<String, String>,
    redcron: &[(String, String)],
) -> Vec<(OsString, OsString)> {
    let inherits = |name: &OsString| {
        let store = name.to_str().is_some_and(|n| secret_env_vars.contains(n));
        let chosen = match inherit {
            InheritEnv::All => true,
            InheritEnv::Nothing => false,
            InheritEnv::Only(names) => name.to_str().is_some_and(|n| names.contains(n)),
        };
        chosen && !store
    };
    let mut env: BTreeMap<OsString, OsString> = worker_env
        .iter()
        .filter(|(name, _)| inherits(name))
        .cloned()
        .collect();
    let own = job_env.iter().chain(redcron.iter().map(|(k, v)| (k, v)));
    env.extend(own.map(|(name, value)| (OsString::from(name), OsString::from(value))));
    env.into_iter().collect()
}

/// Makes the worker not dumpable (`PR_SET_DUMPABLE` 0): its `/proc/<pid>/environ`, `mem` and the like
/// cannot be read by its jobs, which run as the same user, nor can they ptrace it (see the module's doc).
pub(crate) fn hide_from_jobs() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_DUMPABLE only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/cron"),
            ("REDIS_PASSWORD", "s3cret"),
            ("SHARED", "worker"),
            ("REDCRON_JOB", "outer"),
        ]
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect()
    }

    fn store() -> BTreeSet<String> {
        BTreeSet::from(["REDIS_PASSWORD".to_string()])
    }

    fn redcron() -> Vec<(String, String)> {
        vec![("REDCRON_JOB".to_string(), "j".to_string())]
    }

    /// The environment as `NAME=value` strings, for readable assertions.
    fn build(inherit: &InheritEnv, job: &[(&str, &str)]) -> Vec<String> {
        let job: BTreeMap<String, String> = job
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        job_environment(&worker(), inherit, &store(), &job, &redcron())
            .into_iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
            .collect()
    }

    #[test]
    fn all_inherits_everything_but_the_store_variables() {
        assert_eq!(
            build(&InheritEnv::All, &[]),
            [
                "HOME=/home/cron",
                "PATH=/usr/bin:/bin",
                "REDCRON_JOB=j",
                "SHARED=worker"
            ]
        );
    }

    #[test]
    fn the_jobs_env_passes_a_store_variable_and_overrides_inherited_ones() {
        let env = build(
            &InheritEnv::All,
            &[("REDIS_PASSWORD", "given"), ("SHARED", "job")],
        );
        assert!(env.contains(&"REDIS_PASSWORD=given".to_string()), "{env:?}");
        assert!(env.contains(&"SHARED=job".to_string()), "{env:?}");
        assert_eq!(env.iter().filter(|e| e.starts_with("SHARED=")).count(), 1);
    }

    #[test]
    fn redcron_variables_come_last() {
        let env = build(&InheritEnv::All, &[("REDCRON_JOB", "mine")]);
        assert!(env.contains(&"REDCRON_JOB=j".to_string()), "{env:?}");
        assert_eq!(
            env.iter().filter(|e| e.starts_with("REDCRON_JOB=")).count(),
            1
        );
    }

    #[test]
    fn none_gives_only_the_jobs_env_and_redcron() {
        assert_eq!(
            build(&InheritEnv::Nothing, &[("A", "1")]),
            ["A=1", "REDCRON_JOB=j"]
        );
    }

    #[test]
    fn a_list_inherits_only_the_names_the_worker_has_and_never_the_store_variables() {
        let only = InheritEnv::Only(BTreeSet::from([
            "PATH".to_string(),
            "MISSING".to_string(),
            "REDIS_PASSWORD".to_string(),
        ]));
        assert_eq!(build(&only, &[]), ["PATH=/usr/bin:/bin", "REDCRON_JOB=j"]);
    }

    #[test]
    fn names_that_are_not_utf8_are_inherited_by_all_only() {
        use std::os::unix::ffi::OsStringExt as _;
        let odd = OsString::from_vec(vec![b'X', 0xff]);
        let worker = vec![(odd.clone(), OsString::from("v"))];
        let none = BTreeMap::new();
        let all = job_environment(&worker, &InheritEnv::All, &store(), &none, &[]);
        assert_eq!(all, [(odd, OsString::from("v"))]);
        let only = InheritEnv::Only(BTreeSet::from(["X".to_string()]));
        assert!(job_environment(&worker, &only, &store(), &none, &[]).is_empty());
    }
}

//! Worker ids: the characters an id may have, the default id of a process (`<host>-<pid>-<6 hex>`), and
//! how a worker tells that an id someone else claimed with is one of this host's.

/// Whether `c` may be part of a worker id (also of an id read from the store).
pub(super) fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-:@".contains(c)
}

/// This host's name as a default id starts with it: the host name with every character an id may not
/// have replaced by `-` (`worker` for a host without a name). Read once: every lost tick asks.
fn host_part() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(read_host_part)
}

fn read_host_part() -> String {
    let host: String = gethostname::gethostname()
        .to_string_lossy()
        .chars()
        .map(|c| if is_id_char(c) { c } else { '-' })
        .collect();
    if host.is_empty() {
        "worker".to_string()
    } else {
        host
    }
}

/// `<hostname>-<pid>-<6 random hex digits>`: unique per process even when a host runs several.
pub(super) fn default_id() -> String {
    format!(
        "{}-{}-{:06x}",
        host_part(),
        std::process::id(),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// Who a claimant's id is, seen from this worker (`own`): a tick lost to one of these was not taken by
/// another host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimantHere {
    /// The claimant has this worker's own id: this worker before a restart (or another process that
    /// was given the same `worker.id`).
    SameId,
    /// A default id of another process of this host: this worker before a restart (the default id
    /// changes with the process), or a second worker on this host.
    OtherProcess,
}

/// Whether `claimant` is this worker's id or a default id of another process of this host; `None` for
/// any other id (another host's, or a configured one).
pub(crate) fn claimant_here(claimant: &str, own: &str) -> Option<ClaimantHere> {
    if claimant == own {
        return Some(ClaimantHere::SameId);
    }
    is_default_id_of(claimant, host_part()).then_some(ClaimantHere::OtherProcess)
}

/// Whether `id` has the shape of [`default_id`] on host `host`: `<host>-<digits>-<6 hex digits>`.
fn is_default_id_of(id: &str, host: &str) -> bool {
    let Some(rest) = id.strip_prefix(host).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let Some((pid, nonce)) = rest.split_once('-') else {
        return false;
    };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && nonce.len() == 6
        && nonce.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::{claimant_here, default_id, is_default_id_of, ClaimantHere};

    #[test]
    fn a_default_id_is_recognised_as_this_hosts() {
        let (own, earlier) = (default_id(), default_id());
        assert_eq!(claimant_here(&own, &own), Some(ClaimantHere::SameId));
        // Two default ids of one process differ in their nonce: an earlier process looks the same.
        assert_ne!(own, earlier);
        assert_eq!(
            claimant_here(&earlier, &own),
            Some(ClaimantHere::OtherProcess)
        );
        assert_eq!(claimant_here("w2", &own), None);
        assert_eq!(claimant_here("w2", "w2"), Some(ClaimantHere::SameId));
    }

    #[test]
    fn only_the_default_shape_on_this_host_counts() {
        assert!(is_default_id_of("vm-1234-0abcde", "vm"));
        assert!(!is_default_id_of("vm2-1234-0abcde", "vm"));
        assert!(!is_default_id_of("vm-1234-0abcd", "vm"));
        assert!(!is_default_id_of("vm-12a4-0abcde", "vm"));
        assert!(!is_default_id_of("vm--0abcde", "vm"));
        assert!(!is_default_id_of("vm-1234-0abcdg", "vm"));
        assert!(!is_default_id_of("vm", "vm"));
        assert!(!is_default_id_of("web-1", "vm"));
    }
}

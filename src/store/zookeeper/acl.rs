//! With digest auth, every node of the store is its user's alone: the chroot and everything under it
//! carry the ACL that ZooKeeper writes for a node this session creates with the creator's rights, and
//! nothing else — so no client without the credentials can delete a claim record, rewrite a fence or
//! remove a lease node (ZooKeeper checks `DELETE` and `CREATE` on a node's *parent*, `WRITE` and `ADMIN`
//! on the node itself).
//!
//! Nodes made earlier without auth (a worker that ran without `username`/`password`, or a chroot someone
//! made by hand) carry `world:anyone:cdrwa`, which ZooKeeper keeps when the nodes are reused. So the
//! first session of a process with auth, before it serves any call, **walks the chroot's tree** top-down
//! ([`lock_down`]): each node's ACL is read, and one that is not the creator's is set to it (the
//! session may: `world:anyone` holds `ADMIN`), and only then are its children listed. A child made
//! before its parent was fixed is in that listing; after the fix nobody but this user (or a super user)
//! can make one. So when the walk ends, every node under the chroot is the user's, and stays so: an
//! unauthenticated worker of an earlier config can neither create, change nor delete a node there (its
//! connect fails making the chroot's directories: *not authorized*). Later sessions of the same process
//! check the chroot and its five directories only.
//!
//! A node this user cannot fix — another identity's, whose ACL grants this one no `ADMIN` (or no
//! `READ`) — makes the store unusable ([`Unfixable`]): the worker stops at start, naming the node and
//! its ACL's identities (never a digest's hash). The ACL of this session's own nodes is learnt, not
//! computed: a probe node is made with the creator's rights and its ACL read back (it also holds the
//! identity of a TLS client certificate when the ensemble adds one).

use futures_util::stream::{FuturesUnordered, StreamExt as _};
use zookeeper_client::{Acl, Acls, Client, CreateMode, Error, Permission};

/// How many nodes the walk has under way at once (as claims: ZooKeeper throttles beyond 1,000).
const IN_FLIGHT: usize = 256;

/// How many of the fixed nodes a report names; the count covers all.
const NAMED: usize = 100;

/// The chroot's directories, which every session checks (the whole tree: the first session only).
pub(super) const DIRS: [&str; 5] = ["jobs", "history", "members", "members-alive", "triggers"];

/// What a walk found and did.
#[derive(Debug, Default)]
pub(super) struct Lockdown {
    /// How many nodes were checked.
    pub checked: usize,
    /// How many nodes carried another ACL and were given the creator's.
    pub fixed: usize,
    /// The first [`NAMED`] of those, as absolute paths.
    pub named: Vec<String>,
}

/// A node of the store this user cannot make its own: the store is unusable until someone acts.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{path} is not this user's and cannot be made so ({why}; its ACL: {acl}): as its owner or a \
     super user, give this user all rights on it and on everything under it, and nobody else any, or \
     delete it"
)]
pub(super) struct Unfixable {
    pub path: String,
    pub why: String,
    /// The ACL as [`show`] writes it, or `unreadable`.
    pub acl: String,
}

/// Why a walk ended early.
#[derive(Debug)]
pub(super) enum Stopped {
    /// A node that cannot be fixed.
    Unfixable(Unfixable),
    /// The ensemble failed (connection lost, session expired): the next session walks again.
    Failed(String),
}

/// `acl` for people: each entry as `scheme:id:perms`, a digest id without its hash (the hash of the
/// password is as good as the password to an attacker who can try guesses offline).
pub(super) fn show(acl: &[Acl]) -> String {
    if acl.is_empty() {
        return "none".to_string();
    }
    acl.iter()
        .map(|entry| {
            let id = match entry.scheme() {
                "digest" => entry.id().split(':').next().unwrap_or_default(),
                _ => entry.id(),
            };
            format!("{}:{id}:{}", entry.scheme(), perms(entry.permission()))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `perms` as zkCli writes them: `cdrwa`, a letter per right held.
fn perms(perms: Permission) -> String {
    [
        (Permission::CREATE, 'c'),
        (Permission::DELETE, 'd'),
        (Permission::READ, 'r'),
        (Permission::WRITE, 'w'),
        (Permission::ADMIN, 'a'),
    ]
    .into_iter()
    .filter(|(perm, _)| perms.has(*perm))
    .map(|(_, letter)| letter)
    .collect()
}

/// Whether `acl` is exactly `own` (in any order): the creator's, nobody else's.
pub(super) fn is_own(acl: &[Acl], own: &[Acl]) -> bool {
    acl.len() == own.len() && acl.iter().all(|entry| own.contains(entry))
}

/// Makes every node at and under `chroot` this session's user's (see the module): the whole tree when
/// `whole`, else the chroot and its [`DIRS`]. `root` is the session's client without chroot.
pub(super) async fn lock_down(
    root: &Client,
    chroot: &str,
    session: i64,
    whole: bool,
) -> Result<Lockdown, Stopped> {
    let own = own_acl(root, chroot, session).await?;
    let mut report = Lockdown::default();
    if !whole {
        let paths = std::iter::once(chroot.to_string())
            .chain(DIRS.iter().map(|dir| format!("{chroot}/{dir}")));
        for path in paths {
            let secured = secure(root, &path, &own, false).await?;
            report.note(&path, &secured);
        }
        return Ok(report);
    }
    // Depth first, so that what waits is at most one listing per level under way.
    let mut waiting: Vec<Vec<String>> = vec![vec![chroot.to_string()]];
    let mut pending = FuturesUnordered::new();
    loop {
        while pending.len() < IN_FLIGHT {
            let Some(path) = next(&mut waiting) else {
                break;
            };
            let own = &own;
            pending.push(async move {
                let secured = secure(root, &path, own, true).await;
                (path, secured)
            });
        }
        let Some((path, secured)) = pending.next().await else {
            return Ok(report);
        };
        let secured = secured?;
        report.note(&path, &secured);
        let prefix = if path == "/" { "" } else { path.as_str() };
        let children: Vec<String> = secured
            .children
            .iter()
            .map(|child| format!("{prefix}/{child}"))
            .collect();
        if !children.is_empty() {
            waiting.push(children);
        }
    }
}

/// The next path to check: the last listed first.
fn next(waiting: &mut Vec<Vec<String>>) -> Option<String> {
    loop {
        let top = waiting.last_mut()?;
        match top.pop() {
            Some(path) => return Some(path),
            None => {
                waiting.pop();
            }
        }
    }
}

/// What securing one node did.
#[derive(Debug, Default)]
struct Secured {
    /// The node existed and was checked.
    checked: bool,
    /// Its ACL was set to the creator's.
    fixed: bool,
    /// Its children, listed after the fix.
    children: Vec<String>,
}

impl Lockdown {
    /// Logs the nodes fixed, if any: a WARN, since the tree was open to anyone until now.
    pub fn log(&self, chroot: &str) {
        if self.fixed == 0 {
            return;
        }
        let more = self.fixed - self.named.len();
        let paths = if more > 0 {
            format!("{} and {more} more", self.named.join(","))
        } else {
            self.named.join(",")
        };
        tracing::warn!(
            event = crate::logging::events::store::ACL_FIXED,
            chroot,
            fixed = self.fixed as u64,
            checked = self.checked as u64,
            paths = %paths,
            "Nodes of the ZooKeeper store had another ACL than this user's (made without auth?): each \
             was given the creator's ACL before the first claim"
        );
    }

    fn note(&mut self, path: &str, secured: &Secured) {
        self.checked += usize::from(secured.checked);
        if secured.fixed {
            self.fixed += 1;
            if self.named.len() < NAMED {
                self.named.push(path.to_string());
            }
        }
    }
}

/// The ACL ZooKeeper gives a node this session creates with the creator's rights: a probe node's,
/// made (ephemeral) under the chroot, read back and deleted.
async fn own_acl(root: &Client, chroot: &str, session: i64) -> Result<Vec<Acl>, Stopped> {
    let probe = format!("{chroot}/acl-probe-{session:x}");
    let options = CreateMode::Ephemeral.with_acls(Acls::creator_all());
    match root.create(&probe, b"", &options).await {
        Ok(_) | Err(Error::NodeExists) => {}
        Err(Error::NoAuth) => {
            return Err(Stopped::Unfixable(Unfixable {
                path: chroot.to_string(),
                why: "this user may not create nodes in it".to_string(),
                acl: acl_of(root, chroot).await,
            }))
        }
        Err(e) => return Err(Stopped::Failed(format!("cannot make {probe}: {e}"))),
    }
    let read = root.get_acl(&probe).await;
    let _ = root.delete(&probe, None).await;
    match read {
        Ok((acl, _)) if !acl.is_empty() => Ok(acl),
        Ok(_) => Err(Stopped::Failed(format!("{probe} has an empty ACL"))),
        Err(e) => Err(Stopped::Failed(format!(
            "cannot read the ACL of {probe}: {e}"
        ))),
    }
}

/// `path`'s ACL as [`show`] writes it, or why it cannot be read.
async fn acl_of(root: &Client, path: &str) -> String {
    match root.get_acl(path).await {
        Ok((acl, _)) => show(&acl),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// Gives `path` the ACL `own` if it has another (at the ACL version read, again if that changed), then
/// lists its children when `list`. A node gone meanwhile is nothing to secure.
async fn secure(root: &Client, path: &str, own: &[Acl], list: bool) -> Result<Secured, Stopped> {
    let unfixable = |why: &str, acl: String| {
        Stopped::Unfixable(Unfixable {
            path: path.to_string(),
            why: why.to_string(),
            acl,
        })
    };
    let failed = |what: &str, e: Error| Stopped::Failed(format!("cannot {what} {path}: {e}"));
    let mut fixed = false;
    for _ in 0..5 {
        let (acl, stat) = match root.get_acl(path).await {
            Ok(read) => read,
            Err(Error::NoNode) => return Ok(Secured::default()),
            Err(Error::NoAuth) => {
                return Err(unfixable(
                    "this user may not read its ACL",
                    "unreadable".to_string(),
                ))
            }
            Err(e) => return Err(failed("read the ACL of", e)),
        };
        if !is_own(&acl, own) {
            match root
                .set_acl(path, &Acls::creator_all(), Some(stat.aversion))
                .await
            {
                Ok(_) => fixed = true,
                Err(Error::BadVersion) => continue,
                Err(Error::NoNode) => return Ok(Secured::default()),
                Err(Error::NoAuth) => {
                    return Err(unfixable("this user may not change its ACL", show(&acl)))
                }
                Err(e) => return Err(failed("set the ACL of", e)),
            }
        }
        let children = if list {
            match root.list_children(path).await {
                Ok(children) => children,
                Err(Error::NoNode) => Vec::new(),
                Err(Error::NoAuth) => {
                    return Err(unfixable(
                        "this user may not list its children",
                        acl_of(root, path).await,
                    ))
                }
                Err(e) => return Err(failed("list the children of", e)),
            }
        } else {
            Vec::new()
        };
        return Ok(Secured {
            checked: true,
            fixed,
            children,
        });
    }
    Err(Stopped::Failed(format!("the ACL of {path} kept changing")))
}

#[cfg(test)]
mod tests {
    use super::{is_own, next, perms, show};
    use zookeeper_client::{Acl, AuthId, Permission};

    fn acl(scheme: &str, id: &str, perms: Permission) -> Acl {
        Acl::new(perms, AuthId::new(scheme, id))
    }

    /// Digest ids are shown without their hash; rights as zkCli's letters.
    #[test]
    fn an_acl_is_shown_without_digests() {
        let open = [acl("world", "anyone", Permission::ALL)];
        assert_eq!(show(&open), "world:anyone:cdrwa");
        let mixed = [
            acl(
                "digest",
                "mallory:xQJmxLMiHGwaqBvst5y6rkB6HQs=",
                Permission::ALL,
            ),
            acl("ip", "10.0.0.1", Permission::READ | Permission::WRITE),
        ];
        let shown = show(&mixed);
        assert_eq!(shown, "digest:mallory:cdrwa,ip:10.0.0.1:rw");
        assert!(!shown.contains("xQJ"), "{shown}");
        assert_eq!(perms(Permission::NONE), "");
        assert_eq!(show(&[]), "none");
    }

    /// Only exactly the creator's ACL is the creator's: any other entry beside it, or other rights, is not.
    #[test]
    fn only_the_creators_acl_is_own() {
        let me = acl("digest", "redcron:h=", Permission::ALL);
        let cert = acl("x509", "CN=worker", Permission::ALL);
        let own = [me.clone(), cert.clone()];
        assert!(is_own(&[cert.clone(), me.clone()], &own));
        assert!(!is_own(std::slice::from_ref(&me), &own));
        let open = acl("world", "anyone", Permission::ALL);
        assert!(!is_own(&[me.clone(), cert.clone(), open.clone()], &own));
        assert!(!is_own(&[open], std::slice::from_ref(&me)));
        let weaker = acl("digest", "redcron:h=", Permission::READ);
        assert!(!is_own(&[weaker], &[me]));
    }

    /// The walk takes the last listed first and drops emptied listings.
    #[test]
    fn the_walk_goes_depth_first() {
        let mut waiting = vec![vec!["/a".to_string(), "/b".to_string()], vec![]];
        assert_eq!(next(&mut waiting).as_deref(), Some("/b"));
        waiting.push(vec!["/b/x".to_string()]);
        assert_eq!(next(&mut waiting).as_deref(), Some("/b/x"));
        assert_eq!(next(&mut waiting).as_deref(), Some("/a"));
        assert_eq!(next(&mut waiting), None);
        assert!(waiting.is_empty());
    }
}

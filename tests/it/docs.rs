//! The documents cite tests by name (`module::test_name`) as the evidence for what they promise, and the
//! code by path (`worker::stagger`, `clock::boot`); a citation that was renamed or removed would leave a
//! promise without evidence. Checked here, by name.

use std::collections::BTreeSet;
use std::path::Path;

/// The modules of this test binary, whose `module::name` citations must resolve.
const MODULES: &[&str] = &[
    "bench_smoke",
    "browser",
    "chaos",
    "claims",
    "cli",
    "clock",
    "config",
    "conformance",
    "dashboard",
    "deploy",
    "embedded",
    "etcd",
    "etcd_in_flight",
    "etcd_pause",
    "etcd_series",
    "history",
    "inspect",
    "job_env",
    "lease_stop",
    "listener",
    "lock",
    "metrics",
    "model",
    "old_workers",
    "pause",
    "recipes",
    "redis_cluster",
    "reload",
    "retries",
    "schedule",
    "sentinel",
    "sql_input",
    "sql_servers",
    "sql_store",
    "trigger",
    "trigger_clock",
    "worker",
    "yaml_limits",
];

/// The documents whose citations are checked: the README and every reference page of docs/.
const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/protocol.md",
    "docs/model.md",
    "docs/configuration.md",
    "docs/cli.md",
    "docs/logs.md",
    "docs/operations.md",
    "docs/guarantees.md",
    "docs/performance.md",
    "docs/development.md",
    "docs/store-embedded.md",
    "docs/store-etcd.md",
    "docs/store-redis.md",
    "docs/store-sql.md",
    "docs/store-zookeeper.md",
];

/// The stores a suite is instantiated for (`conformance::etcd::name`, `lock::redis::name`): a citation may
/// name the store between the module and the test.
const STORES: &[&str] = &[
    "redis",
    "etcd",
    "embedded",
    "postgres",
    "mariadb",
    "zookeeper",
    "redis_sentinel",
    "redis_cluster",
];

/// Every `module::name` (or `module::<store>::name`, one store's run of a test) in backticks in `text`
/// whose module is one of [`MODULES`].
fn citations(text: &str) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    let is_ident =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    for quoted in text.split('`').skip(1).step_by(2) {
        let (module, name) = match quoted.split("::").collect::<Vec<_>>()[..] {
            [module, name] => (module, name),
            [module, store, name] if STORES.contains(&store) => (module, name),
            _ => continue,
        };
        if MODULES.contains(&module) && is_ident(name) {
            found.insert((module.to_string(), name.to_string()));
        }
    }
    found
}

/// The source of module `module` under `base` (`tests/it` or `src`): `<module>.rs` and every file under
/// `<module>/`, empty if there is neither.
fn module_source(base: &Path, module: &str) -> String {
    let mut text = std::fs::read_to_string(base.join(format!("{module}.rs"))).unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir(base.join(module)) {
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                text += &std::fs::read_to_string(&path).expect("source file");
            }
        }
    }
    text
}

/// Whether `module::name` names a test of this binary, a function of the library, or a module file.
fn resolves(root: &Path, module: &str, name: &str) -> bool {
    let function = format!("fn {name}(");
    module_source(&root.join("tests/it"), module).contains(&function)
        || module_source(&root.join("src"), module).contains(&function)
        || root
            .join("src")
            .join(module)
            .join(format!("{name}.rs"))
            .is_file()
}

#[test]
fn every_test_the_documents_cite_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut cited = 0;
    for doc in DOCUMENTS {
        let text = std::fs::read_to_string(root.join(doc)).expect("document");
        for (module, name) in citations(&text) {
            cited += 1;
            if !resolves(root, &module, &name) {
                missing.push(format!("{doc}: `{module}::{name}`"));
            }
        }
    }
    assert!(
        cited > 10,
        "the documents cite only {cited} tests: did the citation format change?"
    );
    assert!(
        missing.is_empty(),
        "cited tests or code that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The tests that only some stores run: for each store, the `extra:` list of its `conformance!` line in
/// `tests/it/conformance/mod.rs` (the suite's shared tests run on every store).
fn conformance_extras(root: &Path) -> Vec<(String, BTreeSet<String>)> {
    let text =
        std::fs::read_to_string(root.join("tests/it/conformance/mod.rs")).expect("the suite");
    let mut stores = Vec::new();
    for line in text.split("\nconformance!(").skip(1) {
        let Some((store, rest)) = line.split_once(',') else {
            continue;
        };
        let Some(list) = rest
            .split_once("extra: [")
            .and_then(|(_, list)| list.split_once(']'))
        else {
            continue;
        };
        let names = list
            .0
            .split(',')
            .filter_map(|item| item.trim().rsplit("::").next())
            .filter(|name| !name.is_empty())
            .map(str::to_string)
            .collect();
        stores.push((store.trim().to_string(), names));
    }
    stores
}

/// A document that cites a conformance test that only some stores run names the store
/// (`conformance::redis::name`, a filter `cargo test` takes), and that store runs it; `conformance::name`
/// alone is for the tests every store runs.
#[test]
fn conformance_citations_name_a_store_that_runs_the_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let extras = conformance_extras(root);
    assert!(
        extras.len() == STORES.len() && extras.iter().any(|(_, names)| !names.is_empty()),
        "cannot read the stores' extra tests from the suite: {extras:?}"
    );
    let mut wrong = Vec::new();
    for doc in DOCUMENTS {
        let text = std::fs::read_to_string(root.join(doc)).expect("document");
        for quoted in text.split('`').skip(1).step_by(2) {
            let runs_it = |store: &str, name: &str| {
                extras
                    .iter()
                    .any(|(s, names)| s == store && names.contains(name))
            };
            let only_some = |name: &str| extras.iter().any(|(_, names)| names.contains(name));
            match quoted.split("::").collect::<Vec<_>>()[..] {
                ["conformance", name] if only_some(name) => wrong.push(format!(
                    "{doc}: `{quoted}` runs on some stores only: name the store"
                )),
                ["conformance", store, name] if only_some(name) && !runs_it(store, name) => wrong
                    .push(format!(
                        "{doc}: `{quoted}`: the {store} store does not run it"
                    )),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

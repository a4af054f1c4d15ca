//! The library's layers: its top-level modules (`src/<module>.rs` and `src/<module>/`) use each other
//! without a cycle, so each can be read, tested and changed with only the ones below it in mind.
//!
//! A use is a `crate::<module>` path in a module's code (comments and `#[cfg(test)]` items left out: a
//! test may reach up). The order they form, lowest first, is printed, for docs/development.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every `.rs` file of module `name` under `src`: `<name>.rs` and everything under `<name>/`.
fn files(src: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        found.push(file);
    }
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    found
}

/// The code of `text` that ships: up to its first `#[cfg(test)]` item at the start of a line (the test
/// modules sit at the end of each file), without comment lines.
fn shipped(text: &str) -> String {
    let end = text.find("\n#[cfg(test)]").unwrap_or(text.len());
    text[..end]
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules, and for each the others it uses, with a file that does.
fn uses(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let modules: BTreeSet<String> = std::fs::read_dir(src)
        .expect("src/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter_map(|path| {
            let stem = path.file_stem()?.to_str()?.to_string();
            let module = path.is_dir() || path.extension().is_some_and(|ext| ext == "rs");
            (module && stem != "lib" && stem != "main").then_some(stem)
        })
        .collect();
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut used = BTreeMap::new();
        for path in files(src, module) {
            let text = shipped(&std::fs::read_to_string(&path).expect("a source file"));
            for (at, _) in text.match_indices("crate::") {
                let rest = &text[at + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != *module && modules.contains(&name) {
                    used.entry(name)
                        .or_insert_with(|| path.display().to_string());
                }
            }
        }
        graph.insert(module.clone(), used);
    }
    graph
}

#[test]
fn the_top_level_modules_use_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = uses(&src);
    // Peel off, again and again, the modules that use none of those left: what cannot be peeled is on
    // a cycle, or above one.
    let mut left: BTreeSet<&String> = graph.keys().collect();
    let mut order = Vec::new();
    loop {
        let free: Vec<&String> = left
            .iter()
            .copied()
            .filter(|module| graph[*module].keys().all(|used| !left.contains(used)))
            .collect();
        if free.is_empty() {
            break;
        }
        for module in free {
            left.remove(module);
            order.push(module.as_str());
        }
    }
    println!("layers, lowest first: {}", order.join(", "));
    // And the modules that nothing left uses (those above a cycle): what stays is on a cycle.
    loop {
        let unused: Vec<&String> = left
            .iter()
            .copied()
            .filter(|module| !left.iter().any(|other| graph[*other].contains_key(*module)))
            .collect();
        if unused.is_empty() {
            break;
        }
        for module in unused {
            left.remove(module);
        }
    }
    let stuck: Vec<String> = left
        .iter()
        .map(|module| {
            let inside: Vec<String> = graph[*module]
                .iter()
                .filter(|(used, _)| left.contains(used))
                .map(|(used, file)| format!("{used} (in {file})"))
                .collect();
            format!("{module} uses {}", inside.join(", "))
        })
        .collect();
    assert!(
        stuck.is_empty(),
        "top-level modules on an import cycle:\n{}",
        stuck.join("\n")
    );
}

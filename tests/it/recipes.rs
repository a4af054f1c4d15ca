//! The fencing recipes of `examples/fencing/`, end to end: real servers, real worker processes of the
//! built binary, and a holder paused past its lease.
//!
//! Each scenario is the one the fencing token exists for. Worker `a` wins a run of the job, whose child
//! is about to write (it waits for the test's go-ahead); the test then pauses worker `a` and its job's
//! process group (SIGSTOP) past the lease's TTL. Worker `b` wins the next run, and its job writes with
//! its higher token. The test resumes `a`'s job, which writes late: the recipe must refuse that write
//! (exit 3, its message in the run's output) and leave `b`'s value standing. The same job also writes a
//! second resource through a copy of the recipe with its check cut out, and there the late write clobbers
//! `b`'s value: the scenario tells a recipe that checks from one that does not, so these tests fail if a
//! recipe's check is removed.
//!
//! [`tokens_past_2_53_are_compared_exactly`] runs each recipe alone with tokens around 2^53 and up to
//! 2^64 − 1, where a comparison through doubles (Lua's `tonumber`, a float column) goes wrong.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::sql::{DATABASE, PASSWORD, USER};
use testkit::{SqlKind, SqlServer};

use crate::cli::{output, redcron};
use crate::support::{RedisCluster, TestDir, Worker, WorkerBuilder};

/// The recipes, as the repository ships them.
fn recipes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fencing")
}

/// The exit status with which every recipe refuses a stale write.
const REFUSED: i32 = 3;

/// One recipe: how a job writes through it, and the check that a copy of it goes without.
struct Recipe {
    /// A shell function body that writes value `$2` to resource `$1` through the recipe in `$recipes`.
    write: &'static str,
    /// The recipe's file that holds the check.
    check_file: &'static str,
    /// The check's text in that file, and what the copy without the check has instead.
    check: (&'static str, &'static str),
}

const POSTGRES: Recipe = Recipe {
    write: r#"sh "$recipes/postgres.sh" "$1" "$2""#,
    check_file: "postgres.sql",
    check: ("\n   AND token < :'token'::numeric;", ";"),
};

const MYSQL: Recipe = Recipe {
    write: r#"sh "$recipes/mysql.sh" "$1" "$2""#,
    check_file: "mysql.sql",
    check: ("\n   AND token < @token;", ";"),
};

const REDIS_LUA_CHECK: (&str, &str) = (
    "  if not below(fence, token) then\n    return {0, fence}\n  end\n",
    "",
);

const REDIS: Recipe = Recipe {
    write: r#"sh "$recipes/redis.sh" "$1" "$2""#,
    check_file: "redis-fence.lua",
    check: REDIS_LUA_CHECK,
};

const PYTHON: Recipe = Recipe {
    write: r#"python3 "$recipes/fenced_write.py" "$1" "$2""#,
    check_file: "redis-fence.lua",
    check: REDIS_LUA_CHECK,
};

const FILE: Recipe = Recipe {
    write: r#"printf '%s\n' "$2" | sh "$recipes/file-fence.sh" "data/$1""#,
    check_file: "file-fence.sh",
    check: (
        r#"if [ -e "$target.fence" ] && ! below "$fence" "$token"; then"#,
        "if false; then",
    ),
};

/// The job's own storage: a real server (or a directory), the environment that points a recipe at it,
/// and what a resource holds there.
enum Storage {
    Postgres(SqlServer),
    Mariadb(SqlServer),
    Redis(RedisCluster),
    /// Files under `data/` of the job's working directory, the test's directory.
    Files(PathBuf),
}

impl Storage {
    /// A PostgreSQL server with `postgres-schema.sql`'s tables, owned by the job's user.
    fn postgres() -> Storage {
        let server = SqlServer::builder(SqlKind::Postgres).fsync(false).start();
        apply_schema(&server, "postgres-schema.sql");
        Storage::Postgres(server)
    }

    /// A MariaDB server with `mysql-schema.sql`'s tables.
    fn mariadb() -> Storage {
        let server = SqlServer::builder(SqlKind::Mariadb).fsync(false).start();
        apply_schema(&server, "mysql-schema.sql");
        Storage::Mariadb(server)
    }

    fn redis() -> Storage {
        Storage::Redis(RedisCluster::start(1))
    }

    /// Files under `<dir>/data/`.
    fn files(dir: &TestDir) -> Storage {
        let data = dir.join("data");
        std::fs::create_dir_all(&data).expect("cannot create the data directory");
        Storage::Files(dir.path().to_owned())
    }

    /// What a recipe reads to find the storage, as the recipes' comments name it.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Storage::Postgres(server) => vec![
                ("PGHOST", "127.0.0.1".to_string()),
                ("PGPORT", server.port().to_string()),
                ("PGUSER", USER.to_string()),
                ("PGPASSWORD", PASSWORD.to_string()),
                ("PGDATABASE", DATABASE.to_string()),
                ("PGSSLMODE", "disable".to_string()),
            ],
            Storage::Mariadb(server) => vec![
                ("MYSQL_HOST", "127.0.0.1".to_string()),
                ("MYSQL_TCP_PORT", server.port().to_string()),
                ("MYSQL_USER", USER.to_string()),
                ("MYSQL_PWD", PASSWORD.to_string()),
                ("MYSQL_DATABASE", DATABASE.to_string()),
                ("MYSQL_CLIENT", "mariadb".to_string()),
            ],
            Storage::Redis(cluster) => vec![("REDIS_URL", cluster.url(0))],
            Storage::Files(_) => Vec::new(),
        }
    }

    /// The value `resource` holds, `None` if it was never written.
    fn read(&self, resource: &str) -> Option<String> {
        let text = match self {
            Storage::Postgres(server) | Storage::Mariadb(server) => server.exec(&format!(
                "SELECT value FROM report WHERE resource = '{resource}';"
            )),
            Storage::Redis(cluster) => cluster.get(0, &format!("{{{resource}}}:value"))?,
            Storage::Files(dir) => match std::fs::read_to_string(dir.join("data").join(resource)) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                Err(e) => panic!("cannot read {resource}: {e}"),
            },
        };
        let text = text.trim_end_matches('\n');
        (!text.is_empty()).then(|| text.to_string())
    }
}

/// Creates the recipe's tables as the job's user (who then owns them).
fn apply_schema(server: &SqlServer, file: &str) {
    let schema = std::fs::read_to_string(recipes().join(file)).expect("the recipe's schema");
    server
        .try_exec_as(USER, PASSWORD, &schema)
        .unwrap_or_else(|e| panic!("{file} failed: {e}"));
}

/// Copies the recipes to `to`, with `recipe`'s check replaced by what stands in for it; panics if the
/// recipe no longer has that check's text (so the copy would not differ).
fn copy_without_check(recipe: &Recipe, to: &Path) {
    std::fs::create_dir_all(to).expect("cannot create the copy's directory");
    for entry in std::fs::read_dir(recipes()).expect("the recipes' directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().expect("a file name");
        std::fs::copy(&path, to.join(name)).expect("cannot copy a recipe");
    }
    let file = to.join(recipe.check_file);
    let text = std::fs::read_to_string(&file).expect("the recipe's file");
    let (check, instead) = recipe.check;
    assert!(
        text.contains(check),
        "{} no longer has the check {check:?}: update this test's copy without it",
        recipe.check_file
    );
    std::fs::write(&file, text.replacen(check, instead, 1)).expect("cannot write the copy");
}

/// The test's job. One run per worker writes (a worker's later runs exit at once, so nothing but the
/// scenario writes); the held worker's run waits for the go-ahead file `FENCE_HOLD` first. It writes
/// `<worker> <token>` to `unfenced` through the copy without the check, then to `fenced` through the
/// recipe, records each exit status in `result.<worker>`, and exits with the recipe's.
fn job_script(recipe: &Recipe) -> String {
    format!(
        r#"#!/bin/sh
mkdir "ran.$FENCE_NAME" 2>/dev/null || exit 0
value="$FENCE_NAME $REDCRON_FENCING_TOKEN"
if [ -n "${{FENCE_HOLD:-}}" ]; then
    while [ ! -e "$FENCE_HOLD" ]; do sleep 0.05; done
fi
write() {{
    recipes=$1
    shift
    {write}
}}
write "$PWD/unchecked" unfenced "$value"
echo "unfenced $?" >>"result.$FENCE_NAME"
write "$RECIPES" fenced "$value"
status=$?
echo "fenced $status" >>"result.$FENCE_NAME"
exit $status
"#,
        write = recipe.write
    )
}

/// One Redis node for the lock, a 2 s lease renewed every 500 ms, and the job every 2 s.
fn config(lock: &RedisCluster) -> String {
    format!(
        "redis:\n  nodes: {}\nlock:\n  ttl: 2s\n  renew_every: 500ms\n  node_timeout: 100ms\n  retry_delay: 50ms\n\
         jobs:\n  - name: report\n    schedule: \"*/2 * * * * *\"\n    command: sh job.sh\n",
        lock.nodes_yaml()
    )
}

/// A worker named `name` (the job's `FENCE_NAME`) whose jobs reach `storage` and the recipes.
fn worker(config: &Path, storage: &Storage, name: &str) -> WorkerBuilder {
    let mut builder = Worker::builder(config)
        .env("FENCE_NAME", name)
        .env("RECIPES", &recipes().to_string_lossy());
    for (key, value) in storage.env() {
        builder = builder.env(key, &value);
    }
    builder
}

/// Sends `signal` to the process group `pgid` (a job runs in a group of its own, led by its pid).
fn signal_group(pgid: u32, signal: i32) {
    let pgid = libc::pid_t::try_from(pgid).expect("a pid");
    // SAFETY: kill has no memory effects; the group's leader is the paused worker's unreaped child, so
    // its pid (and group id) cannot be reused while the test signals it.
    let sent = unsafe { libc::kill(-pgid, signal) };
    assert_eq!(sent, 0, "kill(-{pgid}, {signal}) failed");
}

/// The contents of `name` in `dir` once it has `lines` lines, waiting up to `timeout`.
fn wait_for_lines(dir: &TestDir, name: &str, lines: usize, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = dir.read(name).unwrap_or_default();
        if text.lines().count() >= lines {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name} has {text:?} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to `timeout` until `pid` has exited: gone, or a zombie not yet reaped.
fn wait_exited(pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let exited = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        };
        if exited {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "job {pid} still runs after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The scenario of the module's doc, for `recipe` on the storage that `storage` starts for the test's
/// directory.
fn a_paused_holders_late_write(recipe: &Recipe, storage: impl FnOnce(&TestDir) -> Storage) {
    let lock = RedisCluster::start(1);
    let dir = TestDir::new();
    let storage = storage(&dir);
    copy_without_check(recipe, &dir.join("unchecked"));
    dir.write("job.sh", job_script(recipe));
    let config = dir.write_config(&config(&lock));
    let go = dir.join("go");

    let mut a = worker(&config, &storage, "a")
        .env("FENCE_HOLD", &go.to_string_lossy())
        .spawn();
    let started = a
        .wait_for_event("run.started", Duration::from_secs(20))
        .expect("worker a started a run");
    let token_a = started["token"].as_u64().expect("a token");
    let pid = u32::try_from(started["pid"].as_u64().expect("a pid")).expect("a pid");
    // A paused holder: the worker (so no watchdog stops the job) and the job (so it writes nothing).
    a.stop();
    signal_group(pid, libc::SIGSTOP);

    let b = worker(&config, &storage, "b").spawn();
    let finished_b = b
        .wait_for_event("run.finished", Duration::from_secs(30))
        .expect("worker b ran the job once a's lease expired");
    assert_eq!(finished_b["outcome"], "success", "{finished_b}");
    let token_b = finished_b["token"].as_u64().expect("a token");
    assert!(token_b > token_a, "b's token {token_b} after a's {token_a}");
    let value_b = format!("b {token_b}");
    assert_eq!(storage.read("fenced").as_deref(), Some(value_b.as_str()));
    assert_eq!(storage.read("unfenced").as_deref(), Some(value_b.as_str()));

    dir.write("go", "");
    signal_group(pid, libc::SIGCONT);
    let result = wait_for_lines(&dir, "result.a", 2, Duration::from_secs(30));
    assert_eq!(
        result,
        format!("unfenced 0\nfenced {REFUSED}\n"),
        "the late write: through the copy without the check, then through the recipe"
    );
    assert_eq!(
        storage.read("fenced").as_deref(),
        Some(value_b.as_str()),
        "the recipe let a's late write (token {token_a}) over b's (token {token_b})"
    );
    assert_eq!(
        storage.read("unfenced"),
        Some(format!("a {token_a}")),
        "without its check the late write lands: the scenario tells the two apart"
    );

    // Resumed once its job has exited (a zombie its paused worker has not reaped: its exit status
    // is kept), worker a logs what the job said and how it ended.
    wait_exited(pid, Duration::from_secs(15));
    a.cont();
    let finished_a = a
        .wait_for(Duration::from_secs(15), |e| {
            e["event"] == "run.finished" && e["token"].as_u64() == Some(token_a)
        })
        .expect("worker a logged its run's end");
    assert_eq!(finished_a["exit_code"], REFUSED, "{finished_a}");
    let refused = a.events("run.output").into_iter().any(|e| {
        e["token"].as_u64() == Some(token_a)
            && e["line"]
                .as_str()
                .is_some_and(|line| line.starts_with("fence: refused: token "))
    });
    assert!(refused, "a's run logged no refusal");
}

/// PostgreSQL: the fence row's `UPDATE … WHERE token < $token` in the write's transaction refuses the
/// paused holder's late write; without the `WHERE` clause's check it lands.
#[test]
fn a_paused_holders_late_write_is_refused_by_postgres() {
    a_paused_holders_late_write(&POSTGRES, |_| Storage::postgres());
}

/// MariaDB (the MySQL recipe): the same, with the writes gated on the fence row's `UPDATE`.
#[test]
fn a_paused_holders_late_write_is_refused_by_mysql() {
    a_paused_holders_late_write(&MYSQL, |_| Storage::mariadb());
}

/// Redis through `redis-cli`: the Lua script that compares and writes in one step refuses it.
#[test]
fn a_paused_holders_late_write_is_refused_by_redis() {
    a_paused_holders_late_write(&REDIS, |_| Storage::redis());
}

/// A Python program (standard library only) calling the same Lua script refuses it.
#[test]
fn a_paused_holders_late_write_is_refused_by_the_python_program() {
    a_paused_holders_late_write(&PYTHON, |_| Storage::redis());
}

/// A file replaced by rename under a flock, after comparing the highest token seen, refuses it.
#[test]
fn a_paused_holders_late_write_is_refused_by_the_file_recipe() {
    a_paused_holders_late_write(&FILE, Storage::files);
}

/// Runs `recipe` once as a job with `token` would, writing `value` to the resource `exact` of `storage`;
/// the recipe's exit status.
fn write_once(recipe: &Recipe, storage: &Storage, dir: &TestDir, token: &str, value: &str) -> i32 {
    let script = format!(
        "write() {{\n    recipes={}\n    {}\n}}\nwrite exact \"$1\"\n",
        shell_quote(&recipes()),
        recipe.write
    );
    let output = Command::new("sh")
        .args(["-c", &script, "sh", value])
        .current_dir(dir.path())
        .envs(storage.env())
        .env("REDCRON_FENCING_TOKEN", token)
        .output()
        .expect("cannot run sh");
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("the recipe died: {output:?}"))
}

/// `path` quoted for the shell.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"))
}

/// Every recipe compares tokens exactly: 2^53 + 1 is above 2^53 (as doubles they are equal), an equal
/// token is refused, and tokens up to 2^64 − 1 (past BIGINT and i64 shell arithmetic) keep their order.
#[test]
fn tokens_past_2_53_are_compared_exactly() {
    const STEPS: [(&str, i32); 7] = [
        ("9007199254740992", 0),
        ("9007199254740993", 0),
        ("9007199254740993", REFUSED),
        ("9007199254740992", REFUSED),
        ("18446744073709551614", 0),
        ("18446744073709551615", 0),
        ("18446744073709551614", REFUSED),
    ];
    let dir = TestDir::new();
    let stores = [
        (&POSTGRES, Storage::postgres()),
        (&MYSQL, Storage::mariadb()),
        (&REDIS, Storage::redis()),
        (&PYTHON, Storage::redis()),
        (&FILE, Storage::files(&dir)),
    ];
    for (recipe, storage) in &stores {
        for (token, expected) in STEPS {
            let value = format!("value of {token}");
            let code = write_once(recipe, storage, &dir, token, &value);
            assert_eq!(code, expected, "{}: token {token}", recipe.check_file);
        }
        assert_eq!(
            storage.read("exact").as_deref(),
            Some("value of 18446744073709551615"),
            "{}",
            recipe.check_file
        );
    }
}

/// Every file of `examples/fencing/` is explained in its README and opens with a comment that says what
/// it does and, under "Limits", what it does not.
#[test]
fn every_recipe_file_is_explained() {
    let readme = std::fs::read_to_string(recipes().join("README.md")).expect("the recipes' README");
    for entry in std::fs::read_dir(recipes()).expect("the recipes' directory") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .to_string();
        if name == "README.md" {
            continue;
        }
        assert!(
            readme.contains(&format!("`{name}`")),
            "README.md does not explain {name}"
        );
        let text = std::fs::read_to_string(&path).expect("a recipe");
        let opening: String = text
            .lines()
            .skip_while(|line| line.starts_with("#!"))
            .take(30)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            opening.starts_with("--") || opening.starts_with('#') || opening.starts_with("\"\"\""),
            "{name} does not open with a comment"
        );
        assert!(
            opening.contains("Limits"),
            "{name} does not state its limits up front"
        );
    }
}

/// The README's `jobs.yaml` snippet is a config that `redcron check` accepts.
#[test]
fn the_readme_jobs_yaml_is_valid() {
    let readme = std::fs::read_to_string(recipes().join("README.md")).expect("the recipes' README");
    let (_, rest) = readme.split_once("```yaml\n").expect("a yaml block");
    let (yaml, _) = rest.split_once("```").expect("the yaml block's end");
    let dir = TestDir::new();
    let config = dir.write_config(yaml);
    let (code, stdout, stderr) = output(
        redcron(dir.path())
            .args(["check", "-c"])
            .arg(&config)
            .env("REPORT_DB_PASSWORD", "secret"),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
}

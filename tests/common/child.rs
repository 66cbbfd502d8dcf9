//! Multi-process tests from one test binary: the binary runs itself again as a child process
//! (`current_exe() --exact <child fn> --ignored --nocapture`) with its configuration in
//! environment variables, and the parent kills, pauses, resumes and stops its copies.
//!
//! - **Parent side**: [`Copies`] holds `n` slots, each with its own state directory and log file
//!   (the child's stdout and stderr, appended across restarts) under one directory. A copy is
//!   spawned, SIGKILLed, SIGSTOPped and SIGCONTed, or stopped with SIGTERM; [`Copies::check_alive`]
//!   turns a copy that exited by itself into an error carrying its log. The directory is removed
//!   when the copies are dropped after [`Copies::finished`] (unless [`KEEP_ENV`] is set), and
//!   kept (its path in every message) otherwise. Dropping the copies SIGKILLs whatever still runs: no child outlives its
//!   test.
//! - **Child side**: the child fn is an `#[ignore]`d `#[test]` that reads its configuration with
//!   [`ChildEnv::get`] (an error when it was not started by a parent, so running the ignored
//!   tests alone fails instead of passing vacuously), logs to stderr ([`init_logging`]) and runs
//!   its application with [`run_until_sigterm`]: exit 0 after a clean shutdown on SIGTERM,
//!   non-zero when the application fails or stops by itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use anyhow::{Context as _, bail};
use kstate::kstate_task::{Ending, Running};

/// Names the parent test: set for every child, and required by [`ChildEnv::get`].
pub const PARENT_ENV: &str = "KSTATE_CHILD_OF";
/// The prefix of every configuration variable a child gets.
pub const PREFIX: &str = "KSTATE_CHILD_";

/// Set (to anything): the copies' directory is kept after a run that passed too.
pub const KEEP_ENV: &str = "KSTATE_CHILD_KEEP";

/// How many lines of each copy's log a failure message quotes (the whole log is in the kept
/// directory).
const LOG_TAIL_LINES: usize = 80;

/// One copy: a slot with its own state directory and log, restarted in place.
/// What a log line names when another writer's records landed in a store's changelog.
const FOREIGN_WRITE: [&str; 2] = ["ForeignWrite", "another writer appended"];
/// What the worker logs when it restores a task whose store disagreed with its changelog.
const RESTORED_AGAIN: &str = "a store disagrees with its changelog: restoring the task again";
/// What the worker logs when a rebalance takes its tasks away.
const TASKS_CLOSED: &str = "committing and closing tasks";
/// What the worker logs when its tasks are lost (a fenced or removed member's): their stores
/// are dropped uncommitted, and whoever is assigned them next restores from the changelog.
const TASKS_DROPPED: &str = "dropping tasks without a commit";
/// What the worker logs when the last commit of tasks a rebalance takes away fails (a foreign
/// write found by that commit, say): they are dropped without it.
const ENDING_COMMIT_FAILED: &str = "the last commit of ending tasks failed";

pub struct Copy {
    pub slot: usize,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    pub starts: usize,
}

impl Copy {
    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether a process of this slot was started and not yet reaped.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let skipped = lines.len().saturating_sub(LOG_TAIL_LINES);
        let mut tail = String::new();
        if skipped > 0 {
            tail += &format!("[{skipped} earlier lines in {}]\n", self.log.display());
        }
        tail += &lines[skipped..].join("\n");
        tail
    }
}

/// The copies of one multi-process test.
pub struct Copies {
    /// The `#[ignore]`d test fn the children run.
    child_fn: &'static str,
    /// The parent test's name (for [`PARENT_ENV`] and messages).
    parent: String,
    /// Configuration every copy gets, as `KSTATE_CHILD_<NAME>`.
    env: BTreeMap<String, String>,
    pub copies: Vec<Copy>,
    dir: PathBuf,
    finished: bool,
}

impl Copies {
    /// `n` slots (none running yet) whose children run `child_fn` with `env` (names without the
    /// prefix). Each child also gets `SLOT` and `STATE_DIR`.
    pub fn new(
        parent: &str,
        child_fn: &'static str,
        env: &[(&str, String)],
        n: usize,
    ) -> anyhow::Result<Copies> {
        let dir = std::env::temp_dir().join(kstate_test_broker::unique_topic(parent));
        std::fs::create_dir_all(&dir)?;
        let copies = (0..n)
            .map(|slot| Copy {
                slot,
                state_dir: dir.join(format!("copy-{slot}")),
                log: dir.join(format!("copy-{slot}.log")),
                child: None,
                starts: 0,
            })
            .collect();
        Ok(Copies {
            child_fn,
            parent: parent.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            copies,
            dir,
            finished: false,
        })
    }

    /// Starts slot `slot` (it must not be running).
    pub fn spawn(&mut self, slot: usize) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        let copy = &mut self.copies[slot];
        anyhow::ensure!(copy.child.is_none(), "copy {slot} is already running");
        copy.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&copy.log)?;
        use std::io::Write as _;
        writeln!(
            &log,
            "=== {}: start {} of copy {slot}",
            self.parent, copy.starts
        )?;
        let mut command = Command::new(exe);
        command
            .args([
                "--exact",
                self.child_fn,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PARENT_ENV, &self.parent)
            .env(format!("{PREFIX}SLOT"), slot.to_string())
            .env(format!("{PREFIX}STATE_DIR"), &copy.state_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (key, value) in &self.env {
            command.env(format!("{PREFIX}{key}"), value);
        }
        copy.child = Some(command.spawn()?);
        Ok(())
    }

    /// An error naming the first copy that exited by itself, with its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.copies.len() {
            self.check_slot_alive(slot)?;
        }
        Ok(())
    }

    /// An error if slot `slot` was started and exited by itself, with its log.
    pub fn check_slot_alive(&mut self, slot: usize) -> anyhow::Result<()> {
        let copy = &mut self.copies[slot];
        if let Some(child) = copy.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            copy.child = None;
            bail!(
                "copy {slot} exited by itself ({status}); its log:\n{}\n{}",
                copy.log_tail(),
                self.where_logs_are()
            );
        }
        Ok(())
    }

    /// SIGKILLs slot `slot` and reaps it; an error if it had exited by itself.
    pub fn kill(&mut self, slot: usize) -> anyhow::Result<()> {
        self.check_alive()?;
        let copy = &mut self.copies[slot];
        let mut child = copy.child.take().context("the copy is not running")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// SIGSTOPs slot `slot`: it keeps its connections and answers nothing.
    pub fn pause(&self, slot: usize) -> anyhow::Result<()> {
        self.signal(slot, "STOP")
    }

    /// SIGCONTs a paused slot.
    pub fn resume(&self, slot: usize) -> anyhow::Result<()> {
        self.signal(slot, "CONT")
    }

    fn signal(&self, slot: usize, signal: &str) -> anyhow::Result<()> {
        let pid = self.copies[slot]
            .pid()
            .with_context(|| format!("copy {slot} is not running"))?;
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid}: {status}");
        Ok(())
    }

    /// Stops slot `slot` with SIGTERM and waits for it; its exit status.
    pub fn stop(&mut self, slot: usize) -> anyhow::Result<ExitStatus> {
        self.signal(slot, "TERM")?;
        let mut child = self.copies[slot].child.take().context("not running")?;
        Ok(child.wait()?)
    }

    /// Stops every running copy with SIGTERM (all signalled first, then waited for); an error
    /// naming each that did not exit 0, with its log.
    pub fn stop_all(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.copies.len() {
            if self.copies[slot].is_running() {
                self.signal(slot, "TERM")?;
            }
        }
        let mut failures = String::new();
        for copy in &mut self.copies {
            if let Some(mut child) = copy.child.take() {
                let status = child.wait()?;
                if !status.success() {
                    failures += &format!(
                        "copy {} exited {status} on SIGTERM; its log:\n{}\n",
                        copy.slot,
                        copy.log_tail()
                    );
                }
            }
        }
        anyhow::ensure!(failures.is_empty(), "{failures}{}", self.where_logs_are());
        Ok(())
    }

    /// Every log line of the copies in `slots` (with its copy) containing one of `words`.
    pub fn grep_logs(&self, slots: &[usize], words: &[&str]) -> Vec<String> {
        let mut found = Vec::new();
        for &slot in slots {
            let text = std::fs::read_to_string(&self.copies[slot].log).unwrap_or_default();
            for line in text.lines() {
                if words.iter().any(|w| line.contains(w)) {
                    found.push(format!("copy {slot}: {line}"));
                }
            }
        }
        found
    }

    /// An error if the log of a copy in `slots` names a foreign write to a changelog: two
    /// writers of one changelog partition. (A store poisoned by a record that was not
    /// delivered in time is not one: under exactly-once the abort clears it.)
    pub fn check_no_foreign_writes(&self, slots: &[usize]) -> anyhow::Result<()> {
        let found = self.grep_logs(slots, &FOREIGN_WRITE);
        anyhow::ensure!(
            found.is_empty(),
            "{} log lines name a foreign write (two writers of one changelog partition), the \
             first ones:\n{}\n{}",
            found.len(),
            found
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
            self.where_logs_are()
        );
        Ok(())
    }

    /// An error if a copy in `slots` saw a foreign write to a changelog and did not afterwards
    /// restore the task again, close its tasks in a rebalance, drop them as lost, or fail the
    /// last commit of tasks it hands over (in the last three the transaction is aborted and the
    /// next owner restores from the changelog): the
    /// recovery from a paused member's aborted records, which land in the partition after the
    /// new owner's restore, and of the paused member itself, whose own records land after the
    /// new owner's.
    /// Judged per copy, in the order of its log: one foreign write can poison a store more
    /// than once (its own deliveries and its transaction's each log it), and one restore
    /// recovers them all.
    pub fn check_foreign_writes_recovered(&self, slots: &[usize]) -> anyhow::Result<()> {
        for &slot in slots {
            let text = std::fs::read_to_string(&self.copies[slot].log).unwrap_or_default();
            let mut unrecovered: Option<&str> = None;
            for line in text.lines() {
                if line.contains("changelog poisoned")
                    && FOREIGN_WRITE.iter().any(|w| line.contains(w))
                {
                    unrecovered.get_or_insert(line);
                } else if [
                    RESTORED_AGAIN,
                    TASKS_CLOSED,
                    TASKS_DROPPED,
                    ENDING_COMMIT_FAILED,
                ]
                .iter()
                .any(|recovered| line.contains(recovered))
                {
                    unrecovered = None;
                }
            }
            if let Some(line) = unrecovered {
                anyhow::bail!(
                    "copy {slot}: a foreign write poisoned a store and no restore again followed: \
                     {line}\n{}",
                    self.logs()
                );
            }
        }
        Ok(())
    }

    /// Every slot.
    pub fn all(&self) -> Vec<usize> {
        (0..self.copies.len()).collect()
    }

    /// The last lines of every copy's log.
    pub fn logs(&self) -> String {
        let mut logs = String::new();
        for copy in &self.copies {
            logs += &format!("--- copy {} ---\n{}\n", copy.slot, copy.log_tail());
        }
        logs + &self.where_logs_are()
    }

    /// Where the copies' logs and state are kept, for an error message.
    pub fn where_logs_are(&self) -> String {
        format!("(all logs and state in {})", self.dir.display())
    }

    /// The run passed: the directory is removed when the copies are dropped.
    pub fn finished(&mut self) {
        self.finished = true;
    }

    /// The directory holding the copies' state and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        for copy in &mut self.copies {
            if let Some(mut child) = copy.child.take() {
                // A paused child still dies of SIGKILL.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if self.finished && std::env::var_os(KEEP_ENV).is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "{}: copies' logs and state kept in {}",
                self.parent,
                self.dir.display()
            );
        }
    }
}

/// A child's configuration, from the `KSTATE_CHILD_*` variables its parent set.
pub struct ChildEnv {
    parent: String,
}

impl ChildEnv {
    /// The configuration of the child fn `child_fn`; an error when no parent started it.
    pub fn get(child_fn: &str) -> anyhow::Result<ChildEnv> {
        match std::env::var(PARENT_ENV) {
            Ok(parent) if !parent.is_empty() => Ok(ChildEnv { parent }),
            _ => bail!(
                "{child_fn} is the child process of a multi-process test of this file, which \
                 starts it with its configuration in {PREFIX}* variables; it does nothing alone \
                 and fails when run without them ({PARENT_ENV} is not set)"
            ),
        }
    }

    /// The parent test's name.
    pub fn parent(&self) -> &str {
        &self.parent
    }

    /// `KSTATE_CHILD_<name>`; an error if it is missing.
    pub fn var(&self, name: &str) -> anyhow::Result<String> {
        std::env::var(format!("{PREFIX}{name}")).with_context(|| {
            format!(
                "{PREFIX}{name} is not set: the parent ({}) did not pass it",
                self.parent
            )
        })
    }

    /// `KSTATE_CHILD_<name>`, parsed.
    pub fn parse<T>(&self, name: &str) -> anyhow::Result<T>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        let text = self.var(name)?;
        text.parse()
            .map_err(|e| anyhow::anyhow!("{PREFIX}{name}={text}: {e}"))
    }

    /// `KSTATE_CHILD_<name>` as a comma-separated list (empty: no items).
    pub fn list(&self, name: &str) -> anyhow::Result<Vec<String>> {
        Ok(self
            .var(name)?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect())
    }
}

/// kstate's and librdkafka's log lines (info and above) to stderr: the copy's log.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `running` until SIGTERM, then shuts it down: `Ok` after a clean shutdown, an error when
/// the application failed or stopped without being asked.
pub async fn run_until_sigterm(running: Running, name: &str) -> anyhow::Result<()> {
    eprintln!("{name}: running ({} partitions)", running.partitions());
    match std::sync::Arc::new(running).run_until_signal().await {
        Ok(Ending::Signalled) => {
            eprintln!("{name}: stopped cleanly");
            Ok(())
        }
        Ok(Ending::Stopped) => bail!("{name}: the application ended by itself"),
        Err(failure) => bail!("{name}: the application failed: {failure}"),
    }
}

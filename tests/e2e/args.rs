//! The e2e runner's arguments, as libtest's: names that are not flags filter scenarios by
//! substring (`--exact`: by whole name), `--skip NAME` leaves out the scenarios it matches,
//! `--list` lists, `--bench-apiserver` runs the apiserver benchmark; libtest's flags that change
//! nothing here (the scenarios run one after another, their output always shown) are taken
//! and ignored; anything else is refused, so a mistyped flag never runs zero scenarios and
//! passes.

/// What the runner was asked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    pub filters: Vec<String>,
    pub skip: Vec<String>,
    pub exact: bool,
    pub list: bool,
    pub bench_apiserver: bool,
}

/// libtest flags without a value that change nothing for this runner.
const IGNORED: &[&str] = &[
    "--nocapture",
    "--show-output",
    "--quiet",
    "-q",
    "--color=never",
];
/// libtest flags with a value (`--flag V` or `--flag=V`) that change nothing here.
const IGNORED_WITH_VALUE: &[&str] = &["--test-threads", "--format", "--color"];

pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
        match a.as_str() {
            "--list" => out.list = true,
            "--exact" => out.exact = true,
            "--bench-apiserver" => out.bench_apiserver = true,
            "--skip" => out.skip.push(
                it.next()
                    .ok_or("--skip needs the name (or part of it) to leave out")?
                    .clone(),
            ),
            _ if a.starts_with("--skip=") => out.skip.push(a["--skip=".len()..].to_owned()),
            _ if IGNORED.contains(&a.as_str()) => {}
            _ if IGNORED_WITH_VALUE.contains(&flag) => {
                if !a.contains('=') {
                    it.next().ok_or(format!("{a} needs a value"))?;
                }
            }
            _ if a.starts_with('-') => {
                return Err(format!(
                    "unknown argument {a}: the e2e runner takes scenario names (or parts of them), --exact, --skip NAME, --list, --bench-apiserver, and libtest's {} (ignored)",
                    IGNORED
                        .iter()
                        .chain(IGNORED_WITH_VALUE)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            _ => out.filters.push(a.clone()),
        }
    }
    Ok(out)
}

impl Args {
    /// Whether the scenario `name` runs.
    pub fn wanted(&self, name: &str) -> bool {
        let hit = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(hit)) && !self.skip.iter().any(hit)
    }
}

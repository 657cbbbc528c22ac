//! The documentation against the code: every relative link in the README, the top-level guides
//! and `docs/` leads to a file that exists (and, with `#anchor`, to a heading of it), and every
//! `--flag` the pages give to a `tether` command is one that command's `--help` lists. A page
//! that names a flag the CLI dropped, or a link to a section that moved, fails here.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use tether_e2e::bin;

/// The workspace root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The pages checked: the front door, the guides beside it, every page under `docs/`, and the
/// SDKs' READMEs.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> = [
        "README.md",
        "CONTRIBUTING.md",
        "BENCHMARKS.md",
        "sdk/python/README.md",
        "sdk/typescript/README.md",
        "fakes/README.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .filter(|p| p.exists())
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text of a page with its fenced code blocks blanked out (their lines kept, for line
/// numbers), so a `#` comment in a shell block is not taken for a heading.
fn prose(text: &str) -> Vec<String> {
    let mut in_code = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                return String::new();
            }
            if in_code {
                String::new()
            } else {
                line.to_string()
            }
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings, numbered as GitHub numbers repeats (`x`, `x-1`).
fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for line in prose(&text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].replace('`', "").as_str());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` on a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].to_string());
        rest = &after[end..];
    }
    out
}

#[test]
fn every_relative_link_and_anchor_in_the_pages_leads_somewhere() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (n, line) in prose(&text).iter().enumerate() {
            for target in link_targets(line) {
                let target = target.split_whitespace().next().unwrap_or("").to_string();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if file.is_empty() {
                    page.clone()
                } else {
                    dir.join(file)
                };
                let at = format!("{}:{}", page.display(), n + 1);
                if !file.exists() {
                    broken.push(format!("{at}: {target}: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if file.extension().is_some_and(|e| e == "md")
                        && !anchors(&file).contains(anchor)
                    {
                        broken.push(format!(
                            "{at}: {target}: no heading with that anchor in {}",
                            file.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every `--flag` and subcommand `tether [SUB...] --help` lists, by command path.
struct Cli {
    help: HashMap<Vec<String>, (BTreeSet<String>, BTreeSet<String>)>,
}

impl Cli {
    fn new() -> Self {
        Cli {
            help: HashMap::new(),
        }
    }

    /// The flags and subcommands of `tether PATH...`.
    fn of(&mut self, path: &[String]) -> &(BTreeSet<String>, BTreeSet<String>) {
        self.help.entry(path.to_vec()).or_insert_with(|| {
            let out = Command::new(bin("tether"))
                .args(path)
                .arg("--help")
                .output()
                .expect("run tether --help");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut flags = BTreeSet::new();
            let mut subcommands = BTreeSet::new();
            let mut in_commands = false;
            for line in text.lines() {
                if line.ends_with(':') && !line.starts_with(' ') {
                    in_commands = line == "Commands:";
                    continue;
                }
                if in_commands {
                    if let Some(word) = line.split_whitespace().next() {
                        subcommands.insert(word.to_string());
                    }
                }
                for word in line.split(|c: char| c.is_whitespace() || c == ',' || c == '=') {
                    if let Some(flag) = word.strip_prefix("--") {
                        let flag: String = flag
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                            .collect();
                        if !flag.is_empty() {
                            flags.insert(flag);
                        }
                    }
                }
            }
            (flags, subcommands)
        })
    }
}

/// The `tether ...` invocations a page shows: inline code spans and code-block lines that
/// start with `tether` or `./tether` (after `$(`, `&&` or a pipe too).
fn invocations(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let pieces: Vec<&str> = if in_code {
            vec![line]
        } else {
            line.split('`').skip(1).step_by(2).collect()
        };
        for piece in pieces {
            let piece = piece.split(" #").next().unwrap_or("");
            for part in piece
                .split(['|', ';', '(', ')'])
                .flat_map(|p| p.split("&&"))
            {
                let words: Vec<String> = part
                    .split_whitespace()
                    .skip_while(|w| {
                        !matches!(
                            *w,
                            "tether" | "./tether" | "target/release/tether" | "target/debug/tether"
                        )
                    })
                    .map(str::to_string)
                    .collect();
                if words.len() > 1 {
                    out.push((n + 1, words[1..].to_vec()));
                }
            }
        }
    }
    out
}

#[test]
fn every_flag_the_pages_give_a_tether_command_is_one_it_takes() {
    let mut cli = Cli::new();
    let mut unknown = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, words) in invocations(&text) {
            // The command path: the words that name subcommands, as far as they go.
            let mut path: Vec<String> = Vec::new();
            for word in &words {
                if word.starts_with('-') {
                    break;
                }
                let (_, subcommands) = cli.of(&path);
                if subcommands.contains(word) {
                    path.push(word.clone());
                } else {
                    break;
                }
            }
            if path.is_empty() {
                continue;
            }
            let (flags, _) = cli.of(&path).clone();
            // Past `--` the words are the remote command's.
            for word in words.iter().take_while(|w| *w != "--") {
                let Some(flag) = word.strip_prefix("--") else {
                    continue;
                };
                let flag: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if !flag.is_empty() && !flags.contains(&flag) {
                    unknown.push(format!(
                        "{}:{line}: `tether {}` takes no --{flag}",
                        page.display(),
                        path.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags the CLI does not take:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_checker_finds_what_it_is_for() {
    // Anchors as GitHub makes them, repeats numbered.
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("p.md");
    std::fs::write(
        &page,
        "# Relays as replicas (PostgreSQL)\n```sh\n# not a heading\n```\n## A\n## A\n",
    )
    .unwrap();
    let found = anchors(&page);
    assert!(found.contains("relays-as-replicas-postgresql"));
    assert!(found.contains("a") && found.contains("a-1"));
    assert!(!found.contains("not-a-heading"));
    // Invocations in code spans and blocks, after `$(` and pipes.
    let calls = invocations("run `id=$(tether create --ttl 30m)` then\n```sh\necho x | ./tether exec $id -- ls # --nope\n```\n");
    assert_eq!(calls[0].1, ["create", "--ttl", "30m"]);
    assert_eq!(calls[1].1, ["exec", "$id", "--", "ls"]);
    // A flag the CLI does not take is caught.
    let mut cli = Cli::new();
    let (flags, subcommands) = cli.of(&[]).clone();
    assert!(subcommands.contains("create") && flags.contains("help"));
    let (flags, _) = cli.of(&["create".to_string()]).clone();
    assert!(flags.contains("ttl") && !flags.contains("no-such-flag"));
}

//! The fakes' Dockerfile builder (Modal's image definitions, Daytona's `buildInfo`
//! snapshots, Runloop's blueprints): Dockerfile commands run against a fake's image store. `FROM` pulls a registry image (or takes a `base_images` entry), `COPY`
//! takes files from the build context (the definition's mount and `context_files`: a file,
//! a directory, or `.` for all of it, keeping each file's mode unless `--chmod` says), and `ENV`, `WORKDIR`, `USER`,
//! `ENTRYPOINT` and `CMD` edit the config; everything lands as one new image. The fake has no
//! container to run commands in, so `RUN` (and any other instruction) fails the build, with
//! the reason in the build log and the result, as a failing step does on the provider.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};

use bytes::Bytes;

use crate::images::{AddFile, ConfigEdit, Images};

/// A context file's permissions when its `COPY` gives no `--chmod` (what Docker gives files
/// that carry no mode of their own).
const DEFAULT_MODE: u32 = 0o644;

/// One parsed Dockerfile instruction.
#[derive(Debug, PartialEq)]
enum Instruction {
    From(String),
    Copy {
        sources: Vec<String>,
        dest: String,
        /// `--chmod`, else each file's own mode.
        mode: Option<u32>,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    Entrypoint(Vec<String>),
    Cmd(Vec<String>),
}

/// A file of a build context: its bytes and, when it has one, its mode.
#[derive(Clone, Debug)]
pub(crate) struct ContextEntry {
    pub data: Bytes,
    pub mode: Option<u32>,
}

/// What a build needs besides its commands.
#[derive(Default)]
pub(crate) struct Inputs {
    /// `docker_tag` → the layout of that (built) image, for `FROM <docker_tag>`.
    pub bases: HashMap<String, PathBuf>,
    /// Path in the context → the file.
    pub context: HashMap<String, ContextEntry>,
}

/// The instructions of a Dockerfile's text: one per line, `\` continuing a line, comments
/// and blank lines dropped.
pub(crate) fn lines(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head.trim_end());
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

/// Builds `commands`, logging each step to `log`; returns the new image's layout.
pub(crate) async fn run(
    images: &Images,
    commands: &[String],
    inputs: Inputs,
    log: &(dyn Fn(String) + Send + Sync),
) -> anyhow::Result<PathBuf> {
    let mut steps = Vec::new();
    for command in commands {
        steps.push(parse(command).with_context(|| format!("in `{command}`"))?);
    }
    let Some((Instruction::From(base_ref), rest)) = steps.split_first() else {
        bail!("the first command must be FROM");
    };
    log(format!("=> Step 0: FROM {base_ref}"));
    let base = match inputs.bases.get(base_ref) {
        Some(layout) => layout.clone(),
        None => images
            .pull(base_ref)
            .await
            .with_context(|| format!("cannot pull the base image {base_ref}"))?,
    };
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let mut files = Vec::new();
    let mut edit = ConfigEdit::default();
    // What a relative COPY destination is under, as Docker resolves it.
    let mut workdir = "/".to_string();
    for (n, step) in rest.iter().enumerate() {
        log(format!("=> Step {}: {}", n + 1, commands[n + 1]));
        match step {
            Instruction::From(_) => bail!("only one FROM is supported (no multi-stage builds)"),
            Instruction::Copy {
                sources,
                dest,
                mode,
            } => {
                let dest = if dest.starts_with('/') {
                    dest.clone()
                } else {
                    format!("{}/{dest}", workdir.trim_end_matches('/'))
                };
                for source in sources {
                    let selected = select(&inputs.context, source)?;
                    for (name, entry, whole) in selected {
                        let local = scratch.path().join(files.len().to_string());
                        std::fs::write(&local, &entry.data).context("writing a context file")?;
                        let path = if !whole || dest.ends_with('/') || sources.len() > 1 {
                            format!("{}/{name}", dest.trim_end_matches('/'))
                        } else {
                            dest.clone()
                        };
                        files.push(AddFile {
                            path,
                            source: local,
                            mode: mode.or(entry.mode).unwrap_or(DEFAULT_MODE),
                        });
                    }
                }
            }
            Instruction::Env(pairs) => edit.env.extend(pairs.iter().cloned()),
            Instruction::Workdir(dir) => {
                workdir = if dir.starts_with('/') {
                    dir.clone()
                } else {
                    format!("{}/{dir}", workdir.trim_end_matches('/'))
                };
                edit.workdir = Some(workdir.clone());
            }
            Instruction::User(user) => edit.user = Some(user.clone()),
            Instruction::Entrypoint(argv) => edit.entrypoint = Some(argv.clone()),
            Instruction::Cmd(argv) => edit.cmd = Some(argv.clone()),
        }
    }
    log("Saving image...".into());
    let images = images.clone();
    let layout = tokio::task::spawn_blocking(move || {
        let layout = images.derive(&base, &files, &edit);
        drop(scratch);
        layout
    })
    .await
    .context("the image writer stopped")??;
    Ok(layout)
}

/// Parses one instruction.
fn parse(command: &str) -> anyhow::Result<Instruction> {
    let command = command.trim();
    let (keyword, args) = command
        .split_once(char::is_whitespace)
        .map(|(k, a)| (k, a.trim()))
        .unwrap_or((command, ""));
    let keyword = keyword.to_ascii_uppercase();
    if args.is_empty() && keyword != "ENTRYPOINT" && keyword != "CMD" {
        bail!("{keyword} needs arguments");
    }
    Ok(match keyword.as_str() {
        "FROM" => {
            let words = words(args)?;
            match words.as_slice() {
                [image] => Instruction::From(image.clone()),
                [image, kw, _] if kw.eq_ignore_ascii_case("AS") => Instruction::From(image.clone()),
                _ => bail!("FROM takes one image"),
            }
        }
        "COPY" => {
            let mut mode = None;
            let mut rest = args;
            // Flags first (`--chmod=755`), then the paths: words, or a JSON array.
            while let Some(flag) = rest.strip_prefix("--") {
                let (word, after) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
                match word.strip_prefix("chmod=") {
                    Some(m) => {
                        mode = Some(
                            u32::from_str_radix(m, 8)
                                .map_err(|_| anyhow!("--chmod={m} is not an octal mode"))?,
                        )
                    }
                    None => bail!("the fake does not support COPY --{word}"),
                }
                rest = after.trim_start();
            }
            let mut paths = if rest.starts_with('[') {
                serde_json::from_str::<Vec<String>>(rest)
                    .map_err(|e| anyhow!("not a JSON array of strings: {e}"))?
            } else {
                words(rest)?
            };
            let Some(dest) = paths.pop().filter(|_| !paths.is_empty()) else {
                bail!("COPY needs a source and a destination");
            };
            Instruction::Copy {
                sources: paths,
                dest,
                mode,
            }
        }
        "ENV" => {
            let words = words(args)?;
            let pairs = if words.iter().all(|w| w.contains('=')) {
                words
                    .into_iter()
                    .map(|w| {
                        let (k, v) = w.split_once('=').expect("checked");
                        (k.to_string(), v.to_string())
                    })
                    .collect()
            } else {
                // The legacy form `ENV KEY value with spaces`.
                let (key, value) = args
                    .split_once(char::is_whitespace)
                    .ok_or_else(|| anyhow!("ENV needs KEY=VALUE"))?;
                vec![(key.to_string(), value.trim().to_string())]
            };
            Instruction::Env(pairs)
        }
        "WORKDIR" => Instruction::Workdir(words(args)?.join(" ")),
        "USER" => Instruction::User(words(args)?.join(" ")),
        "ENTRYPOINT" => Instruction::Entrypoint(argv(args)?),
        "CMD" => Instruction::Cmd(argv(args)?),
        "RUN" => bail!(
            "the fake has no image builder to run RUN commands in; build with COPY, ENV, \
             WORKDIR, USER, ENTRYPOINT and CMD only"
        ),
        other => bail!("the fake cannot build {other} instructions"),
    })
}

/// The context files a COPY `source` names, each with its name under the destination and
/// whether the source named that one file: a file by its path (a leading `/` or `./` is the
/// context's root), or a directory (`.` or `/` for the whole context) for every file under
/// it, named by its path below. Wildcards are not supported.
fn select<'a>(
    context: &'a HashMap<String, ContextEntry>,
    source: &str,
) -> anyhow::Result<Vec<(String, &'a ContextEntry, bool)>> {
    fn clean(path: &str) -> &str {
        let mut path = path.trim_end_matches('/');
        loop {
            let next = path
                .strip_prefix("./")
                .or_else(|| path.strip_prefix('/'))
                .unwrap_or(path);
            if next == path {
                return if path == "." { "" } else { path };
            }
            path = next;
        }
    }
    if source.contains(['*', '?', '[']) {
        bail!("the fake does not expand wildcards in COPY sources ({source})");
    }
    let wanted = clean(source);
    let mut found: Vec<(String, &ContextEntry, bool)> = Vec::new();
    for (path, entry) in context {
        let path = clean(path);
        if path == wanted {
            let name = path.rsplit('/').next().unwrap_or(path).to_string();
            return Ok(vec![(name, entry, true)]);
        }
        let under = if wanted.is_empty() {
            Some(path)
        } else {
            path.strip_prefix(wanted).and_then(|p| p.strip_prefix('/'))
        };
        if let Some(name) = under {
            found.push((name.to_string(), entry, false));
        }
    }
    if found.is_empty() {
        bail!("COPY source {source} is not in the build context (the files sent with the build)");
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// An ENTRYPOINT's or CMD's argv: the exec form (a JSON array) or the shell form.
fn argv(args: &str) -> anyhow::Result<Vec<String>> {
    if args.starts_with('[') {
        return serde_json::from_str(args).map_err(|e| anyhow!("not a JSON array of strings: {e}"));
    }
    if args.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec!["/bin/sh".into(), "-c".into(), args.into()])
}

/// Splits Dockerfile arguments into words: double and single quotes group, a backslash
/// escapes the next character. Variable substitution is not done: an unescaped `$` fails.
fn words(args: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = args.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), c) => word.push(c),
            (_, '\\') => {
                let next = chars
                    .next()
                    .ok_or_else(|| anyhow!("a trailing backslash"))?;
                word.push(next);
                in_word = true;
            }
            (_, '$')
                if chars
                    .peek()
                    .is_some_and(|n| n.is_alphanumeric() || *n == '{' || *n == '_') =>
            {
                bail!("the fake does not expand variables; escape '$' as '\\$'")
            }
            (Some('"'), '"') => quote = None,
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (_, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        bail!("an unclosed quote");
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_parse_as_docker_reads_them() {
        assert_eq!(
            parse("COPY --chmod=755 /tether-agent /usr/local/bin/tether-agent").unwrap(),
            Instruction::Copy {
                sources: vec!["/tether-agent".into()],
                dest: "/usr/local/bin/tether-agent".into(),
                mode: Some(0o755),
            }
        );
        assert_eq!(
            parse(r#"COPY ["a b", "/opt/c"]"#).unwrap(),
            Instruction::Copy {
                sources: vec!["a b".into()],
                dest: "/opt/c".into(),
                mode: None,
            }
        );
        assert_eq!(
            parse(r#"ENV A="hi \"you\" \$HOME" B=2"#).unwrap(),
            Instruction::Env(vec![
                ("A".into(), "hi \"you\" $HOME".into()),
                ("B".into(), "2".into())
            ])
        );
        assert_eq!(
            parse("ENTRYPOINT []").unwrap(),
            Instruction::Entrypoint(vec![])
        );
        assert_eq!(
            parse(r#"CMD ["/a", "b"]"#).unwrap(),
            Instruction::Cmd(vec!["/a".into(), "b".into()])
        );
        assert_eq!(
            parse("WORKDIR /work dir").unwrap(),
            Instruction::Workdir("/work dir".into())
        );
    }

    #[test]
    fn copy_sources_name_files_directories_or_everything() {
        let entry = |mode| ContextEntry {
            data: Bytes::from_static(b"x"),
            mode,
        };
        let context = HashMap::from([
            ("/tether-agent".to_string(), entry(Some(0o755))),
            ("/usr/local/bin/tool".to_string(), entry(None)),
            ("/usr/share/doc".to_string(), entry(None)),
        ]);
        let names = |source: &str| -> Vec<(String, bool)> {
            select(&context, source)
                .unwrap()
                .into_iter()
                .map(|(n, _, whole)| (n, whole))
                .collect()
        };
        assert_eq!(names("/tether-agent"), [("tether-agent".to_string(), true)]);
        assert_eq!(
            names("./tether-agent"),
            [("tether-agent".to_string(), true)]
        );
        assert_eq!(names("usr/local"), [("bin/tool".to_string(), false)]);
        assert_eq!(names(".").len(), 3);
        assert_eq!(names("/")[0], ("tether-agent".to_string(), false));
        assert!(select(&context, "/missing").is_err());
        assert!(select(&context, "*.txt").is_err());
    }

    #[test]
    fn dockerfile_text_splits_into_instructions() {
        let text = "# a comment\nFROM base:v1\n\nENV A=1 \\\n    B=2\nCMD [\"x\"]\n";
        assert_eq!(lines(text), ["FROM base:v1", "ENV A=1 B=2", "CMD [\"x\"]"]);
    }

    #[test]
    fn what_the_fake_cannot_build_is_refused_clearly() {
        let err = parse("RUN apt-get install -y curl").unwrap_err();
        assert!(err.to_string().contains("no image builder"), "{err}");
        assert!(parse("EXPOSE 80").is_err());
        assert!(parse("ENV A=$HOME").is_err());
        assert!(parse("COPY onlyone").is_err());
    }
}

//! User lookup from /etc/passwd and /etc/group, without NSS, so a static binary can do it.

use std::path::PathBuf;

/// An account from /etc/passwd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Account {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: PathBuf,
    /// Login shell.
    pub shell: PathBuf,
}

fn accounts() -> Vec<Account> {
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    text.lines().filter_map(parse_passwd_line).collect()
}

fn parse_passwd_line(line: &str) -> Option<Account> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || line.starts_with('#') {
        return None;
    }
    Some(Account {
        name: f[0].to_string(),
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: PathBuf::from(f[5]),
        shell: PathBuf::from(f[6]),
    })
}

/// The account with this uid.
pub(crate) fn by_uid(uid: u32) -> Option<Account> {
    accounts().into_iter().find(|a| a.uid == uid)
}

/// The account named `user`, or with `user` as its numeric uid.
pub(crate) fn lookup(user: &str) -> Option<Account> {
    // An image's USER may be `user:group` (either part a name or a number).
    if let Some((user, group)) = user.split_once(':') {
        let mut account = lookup(user)?;
        account.gid = match group.parse() {
            Ok(gid) => gid,
            Err(_) => group_id(group)?,
        };
        return Some(account);
    }
    let all = accounts();
    if let Some(a) = all.iter().find(|a| a.name == user) {
        return Some(a.clone());
    }
    let uid: u32 = user.parse().ok()?;
    Some(all.into_iter().find(|a| a.uid == uid).unwrap_or(Account {
        name: user.to_string(),
        uid,
        gid: uid,
        home: PathBuf::from("/"),
        shell: PathBuf::from("/bin/sh"),
    }))
}

/// The id of the group `name` in /etc/group.
fn group_id(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[0] == name)
        .and_then(|f| f[2].parse().ok())
}

/// Supplementary group ids of `name` from /etc/group.
pub(crate) fn groups_of(name: &str, primary: u32) -> Vec<u32> {
    let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let mut gids = vec![primary];
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && f[3].split(',').any(|m| m == name) {
            if let Ok(gid) = f[2].parse() {
                if !gids.contains(&gid) {
                    gids.push(gid);
                }
            }
        }
    }
    gids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let a = parse_passwd_line("bob:x:1000:1001:Bob:/home/bob:/bin/bash").unwrap();
        assert_eq!((a.uid, a.gid), (1000, 1001));
        assert_eq!(a.home, PathBuf::from("/home/bob"));
        assert!(parse_passwd_line("garbage").is_none());
    }

    #[test]
    fn user_and_group_pairs_resolve_both_parts() {
        let a = lookup("0:5").unwrap();
        assert_eq!((a.uid, a.gid, a.name.as_str()), (0, 5, "root"));
        assert_eq!(lookup("root:root").unwrap().gid, 0);
        assert!(lookup("root:no-such-group-here").is_none());
        let numeric = lookup("4242:4243").unwrap();
        assert_eq!((numeric.uid, numeric.gid), (4242, 4243));
    }
}

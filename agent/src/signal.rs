//! Signal names and numbers as clients write them (`"INT"`, `"SIGINT"`, `"2"`), parsed into
//! the signals the agent may send.

use std::str::FromStr;

use nix::sys::signal::Signal;
use tether_proto::ErrorCode;

use crate::stream::OpError;

/// Parses a signal given by name, with or without the `SIG` prefix and in any case, or by
/// number.
pub(crate) fn parse(text: &str) -> Result<Signal, OpError> {
    let text = text.trim();
    let invalid = || {
        OpError::new(
            ErrorCode::InvalidArgument,
            format!(
                "unknown signal {text:?}; give a name such as \"TERM\" or a number such as \"15\""
            ),
        )
    };
    if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
        let n: i32 = text.parse().map_err(|_| invalid())?;
        return Signal::try_from(n).map_err(|_| invalid());
    }
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    Signal::from_str(&format!("SIG{name}")).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_prefixes_and_numbers() {
        for text in ["INT", "SIGINT", "2", "int", "sigint", " INT "] {
            assert_eq!(parse(text).unwrap(), Signal::SIGINT, "{text}");
        }
        assert_eq!(parse("9").unwrap(), Signal::SIGKILL);
        assert_eq!(parse("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse("SIGWINCH").unwrap(), Signal::SIGWINCH);
    }

    #[test]
    fn rejects_unknown_signals() {
        for text in ["", "0", "65", "NOPE", "SIG", "-9", "9x"] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArgument, "{text}");
        }
    }
}

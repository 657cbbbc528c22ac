//! Who is calling: what every handler and the policy know of a request's sender, once `auth`
//! has checked its token.

use tether_store::{Role, Tenant};

/// Who is calling: the tenant of the request's token.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    /// The tenant whose sandboxes the caller sees.
    pub tenant: Tenant,
    /// What the caller's token may do.
    pub role: Role,
}

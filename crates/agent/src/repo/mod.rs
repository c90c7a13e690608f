//! `Baseline` and `Diff`: the user's repository in the workspace, and the agent's private
//! record of the imported state.
//!
//! Two repositories are involved:
//!
//! - the **user's** (`<workspace>/.git`), made by git running *as the sandbox user* (the
//!   request's owner), so the user owns it and nothing the agent does there runs with more
//!   privilege than the user has. It gets the imported history and HEAD, and an index equal to
//!   HEAD, so `git status` in the guest shows the uncommitted changes the project had on the
//!   host. What the user does with it later does not matter to the agent.
//! - the **private** one (`<state dir>/private/baseline.git`, with its index
//!   `<state dir>/private/index`). The baseline is a commit of the whole work tree there; every
//!   diff is baseline → work tree, computed there, with `--git-dir`/`--work-tree` given on
//!   every call so that the workspace's own `.git` (config, hooks, attributes filters) is never
//!   read. The private repository's `info/attributes` holds
//!   [`dynocap_proto::NEUTRAL_ATTRIBUTES`], which outranks the work tree's `.gitattributes`,
//!   so that they cannot change content either, with any git; where git supports it (2.40+),
//!   `GIT_ATTR_SOURCE` also points at the empty tree.
//!
//! Every git run that reads the workspace runs as the sandbox user, never as the agent: the
//! user can swap a directory for a symlink while git walks the tree, and git then reads what
//! the symlink points to. As the sandbox user, that can only be what the user could read
//! anyway. [`gitguard`](crate::gitguard) explains how those runs reach the private repository (a descriptor,
//! below the agent's 0700 state directory) while no other process of that user can reach it
//! or them. The baseline commit id is kept in the state directory and named explicitly.
//!
//! Both requests hold the server's repository lock, so they never race on the private index.
//!
//! The parts: [`request`] (what both requests share), [`user_repo`] (the user's repository),
//! [`private`] (the private one and its notes), [`index`] (bringing the private index up to
//! date), [`changes`] (what it changes against the baseline), [`attributes`] (the neutral
//! attributes and the big files), and the two requests, [`baseline`] and [`diff`].

mod attributes;
mod baseline;
mod changes;
mod diff;
mod error;
mod index;
mod private;
mod request;
mod user_repo;

#[cfg(test)]
mod tests;

pub use baseline::baseline;
pub use diff::diff;

//! The Lua scripts of the protocol, each with its safety argument.

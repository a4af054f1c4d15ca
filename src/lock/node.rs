//! One Redis node: its address (shown without password) and its connection.

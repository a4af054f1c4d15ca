//! PLACEHOLDER until the helper's module lands.
pub(crate) fn describe(expression: &str, timezone: &str) -> String {
    format!("cron \"{expression}\" in {timezone}")
}

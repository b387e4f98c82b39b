//! softnic's verbs client library (placeholder).

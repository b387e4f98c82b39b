//! Sans-IO RoCEv2 transport (placeholder, filled by the RC transport work).

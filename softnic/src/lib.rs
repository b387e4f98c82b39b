//! softnic: the NIC process (placeholder).

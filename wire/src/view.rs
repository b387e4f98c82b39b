//! The boilerplate every fixed-length header view shares: construction, length check
//! and access to the underlying buffer.

/// Declares `pub struct $name<T>` as a zero-copy view of a `$len`-byte header.
macro_rules! header_view {
    ($(#[$m:meta])* $name:ident, $layer:expr, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps `buffer` without checking its length; accessors on a short buffer
            /// return zeros (they never panic). Prefer [`Self::new_checked`].
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps `buffer` after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::error::Result<Self> {
                $crate::error::check_len($layer, buffer.as_ref(), HEADER_LEN)?;
                Ok(Self { buffer })
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes (the first `HEADER_LEN` bytes of the buffer, or fewer
            /// when unchecked and short).
            pub fn header_bytes(&self) -> &[u8] {
                let b = self.buffer.as_ref();
                &b[..b.len().min(HEADER_LEN)]
            }
        }

        /// Length of the header in bytes.
        pub const HEADER_LEN: usize = $len;
    };
}

pub(crate) use header_view;

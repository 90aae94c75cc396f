//! pinch for iOS. STUB.

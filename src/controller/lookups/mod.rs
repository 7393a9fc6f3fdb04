//! What every replica looks up for `/validate` and the Jobs: StorageClasses, a credentials
//! Secret's metadata, this replica's own image.

pub mod credentials;
pub mod own_image;
pub mod storage_classes;

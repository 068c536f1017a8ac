//! etcd's errors (`crate::errors`) as gRPC statuses: the one place where the layers below the
//! API, which know no gRPC, meet tonic's codes.

use crate::errors::{Code, EtcdError};

impl From<EtcdError> for tonic::Status {
    fn from(e: EtcdError) -> Self {
        tonic::Status::new(grpc_code(e.code), e.message)
    }
}

fn grpc_code(code: Code) -> tonic::Code {
    match code {
        Code::InvalidArgument => tonic::Code::InvalidArgument,
        Code::NotFound => tonic::Code::NotFound,
        Code::PermissionDenied => tonic::Code::PermissionDenied,
        Code::ResourceExhausted => tonic::Code::ResourceExhausted,
        Code::FailedPrecondition => tonic::Code::FailedPrecondition,
        Code::OutOfRange => tonic::Code::OutOfRange,
        Code::Unavailable => tonic::Code::Unavailable,
        Code::DataLoss => tonic::Code::DataLoss,
        Code::Unauthenticated => tonic::Code::Unauthenticated,
    }
}

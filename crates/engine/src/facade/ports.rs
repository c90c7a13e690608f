//! The client API for port forwards ([`crate::supervisor::ports`]): add, remove and list a
//! live sandbox's or task's forwards through its supervisor, and the forwards listings show.

use crate::facade::sandboxes::{find, unexpected, Engine};
use crate::foundation::error::Result;
pub use crate::model::sandbox_info::PortForward;
use crate::store::catalog::{Record, State};
use crate::supervisor::control::{ControlReply, ControlRequest};
use crate::supervisor::ports::read_forwards;
pub use crate::supervisor::ports::{check_port, ForwardRequest, MAX_FORWARDS};

impl Engine {
    /// Forwards a host port to a guest port of the live sandbox or task `name`.
    pub async fn port_add(&self, name: &str, request: &ForwardRequest) -> Result<PortForward> {
        check_port("the guest port", request.guest_port, "GUESTPORT")?;
        let record = self.live_forwardable(name)?;
        forward_reply(
            self.call(&record, &ControlRequest::Forward(request.clone()))
                .await?,
        )
    }

    /// Stops the forward of `guest_port`; returns it.
    pub async fn port_remove(&self, name: &str, guest_port: u16) -> Result<PortForward> {
        let record = self.live_forwardable(name)?;
        forward_reply(
            self.call(&record, &ControlRequest::Unforward { guest_port })
                .await?,
        )
    }

    /// The forwards of the live sandbox or task `name`, oldest first.
    pub async fn ports(&self, name: &str) -> Result<Vec<PortForward>> {
        let record = self.live_forwardable(name)?;
        match self.call(&record, &ControlRequest::Forwards).await? {
            ControlReply::Forwards(list) => Ok(list),
            ControlReply::Error(err) => Err(err),
            other => Err(unexpected(&other)),
        }
    }

    /// Adds each of `requests` to the sandbox just started as `name`; on the first that
    /// fails, the sandbox is destroyed (it was started for these forwards) and the error
    /// returned. The forwards made, in order.
    pub async fn publish(
        &self,
        name: &str,
        requests: &[ForwardRequest],
    ) -> Result<Vec<PortForward>> {
        let mut made = Vec::new();
        for request in requests {
            match self.port_add(name, request).await {
                Ok(forward) => made.push(forward),
                Err(err) => {
                    let kind = find(&*self.catalog()?, name).map(|r| r.kind);
                    // A task's end keeps what little it did, as any finish does.
                    let ended = match kind {
                        Ok(crate::store::catalog::Kind::Task) => {
                            self.task_finish(name, false).await.map(|_| ())
                        }
                        _ => self.destroy(name).await.map(|_| ()),
                    };
                    if let Err(cleanup) = ended {
                        tracing::warn!("removing {name} after its forward failed: {cleanup}");
                    }
                    return Err(err);
                }
            }
        }
        Ok(made)
    }

    /// Checks forwards asked for with a start before anything boots: the ports, no guest
    /// port twice, and that each named host port can be listened on now (it may still be
    /// taken before the sandbox is up; [`Engine::publish`] then ends the sandbox).
    pub fn check_publish(requests: &[ForwardRequest]) -> Result<()> {
        if requests.len() > MAX_FORWARDS {
            return Err(crate::foundation::error::Error::invalid(format!(
                "{} forwards asked for; a sandbox holds at most {MAX_FORWARDS}",
                requests.len()
            )));
        }
        for (i, request) in requests.iter().enumerate() {
            check_port("a published guest port", request.guest_port, "GUEST")?;
            if requests[..i]
                .iter()
                .any(|other| other.guest_port == request.guest_port)
            {
                return Err(crate::foundation::error::Error::invalid(format!(
                    "guest port {} is published twice; publish each guest port once",
                    request.guest_port
                )));
            }
            let overlaps = |other: &ForwardRequest| {
                other.host_port == request.host_port
                    && (other.host_address == request.host_address
                        || other.host_address.is_unspecified()
                        || request.host_address.is_unspecified())
            };
            if request.host_port != 0 {
                if let Some(other) = requests[..i].iter().find(|other| overlaps(other)) {
                    return Err(crate::foundation::error::Error::invalid(format!(
                        "host port {} is published twice (for guest ports {} and {}); give \
                         each forward its own host port, or 0 for a free one",
                        request.host_port, other.guest_port, request.guest_port
                    )));
                }
            }
        }
        // Only a list that is right in itself is tried against the host: a mistake in it is
        // told the same whatever else listens on the machine.
        for request in requests.iter().filter(|request| request.host_port != 0) {
            let wanted = std::net::SocketAddr::new(request.host_address, request.host_port);
            std::net::TcpListener::bind(wanted)
                .map_err(|err| crate::supervisor::ports::bind_error(wanted, &err))?;
        }
        Ok(())
    }

    /// The forwards listings show: read from the file the supervisor keeps, only while the
    /// catalog says the sandbox runs.
    pub(crate) fn port_forwards(&self, record: &Record) -> Vec<PortForward> {
        if record.state != State::Running {
            return Vec::new();
        }
        read_forwards(&self.home().sandbox_dir(&record.id))
    }

    fn live_forwardable(&self, name: &str) -> Result<Record> {
        let kind = find(&*self.catalog()?, name)?.kind;
        self.live_record(name, kind)
    }
}

fn forward_reply(reply: ControlReply) -> Result<PortForward> {
    match reply {
        ControlReply::Forward(forward) => Ok(forward),
        ControlReply::Error(err) => Err(err),
        other => Err(unexpected(&other)),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::foundation::error::ErrorCode;

    fn request(guest_port: u16, host_port: u16, address: &str) -> ForwardRequest {
        ForwardRequest {
            guest_port,
            host_port,
            host_address: address.parse::<IpAddr>().unwrap(),
        }
    }

    /// One host port for two forwards is refused before anything boots, saying which, whether
    /// or not something on the host listens on it (here something does); free ports (0) and
    /// distinct addresses are not.
    #[test]
    fn a_host_port_published_twice_is_refused_before_the_boot() {
        let taken = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let err = Engine::check_publish(&[
            request(8000, port, "127.0.0.1"),
            request(8001, port, "127.0.0.1"),
        ])
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
        assert!(
            err.message
                .contains(&format!("host port {port} is published twice"))
                && err.message.contains("8000 and 8001"),
            "{err}"
        );
        let err = Engine::check_publish(&[
            request(8000, port, "0.0.0.0"),
            request(8001, port, "127.0.0.1"),
        ])
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
        // Right in itself, the list is then tried against the host.
        let err = Engine::check_publish(&[request(8000, port, "127.0.0.1")]).unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict, "{err}");
        Engine::check_publish(&[request(8000, 0, "127.0.0.1"), request(8001, 0, "127.0.0.1")])
            .unwrap();
    }
}

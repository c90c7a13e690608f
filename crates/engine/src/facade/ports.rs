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
            if request.host_port != 0 {
                let wanted = std::net::SocketAddr::new(request.host_address, request.host_port);
                std::net::TcpListener::bind(wanted)
                    .map_err(|err| crate::supervisor::ports::bind_error(wanted, &err))?;
            }
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

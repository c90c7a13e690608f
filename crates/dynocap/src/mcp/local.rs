//! Runs tool calls in the server's `LocalSet`. The engine's futures are not `Send` (they
//! hold a SQLite connection across awaits), while the MCP SDK wants `Send` request handlers
//! (it spawns them); a request therefore hands its call to the `LocalSet` and waits for the
//! answer. If the request is dropped (the client cancelled it, or left),
//! the answer's receiver closes and the call's future is dropped on this thread, which is
//! how the engine cancels an exec or undoes a start. SDK-free.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

use dynocap_engine::task_spec::Progress;
use dynocap_engine::Error;

use super::calls::{Output, Tools};
use super::tools::ToolDef;

type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// The `Send` handle requests use to run calls on the local thread.
#[derive(Clone)]
pub struct Dispatcher {
    tools: Arc<Tools>,
    jobs: mpsc::UnboundedSender<Job>,
}

/// Spawns each received job on the current `LocalSet`; returns when every `Dispatcher` is
/// gone. Must be polled inside `LocalSet::run_until`.
pub async fn execute(mut jobs: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = jobs.recv().await {
        tokio::task::spawn_local(job());
    }
}

impl Dispatcher {
    pub fn new(tools: Arc<Tools>) -> (Self, mpsc::UnboundedReceiver<Job>) {
        let (jobs, receiver) = mpsc::unbounded_channel();
        (Self { tools, jobs }, receiver)
    }

    pub fn definitions(&self) -> &[ToolDef] {
        self.tools.definitions()
    }

    pub fn find(&self, name: &str) -> Option<&ToolDef> {
        self.tools.find(name)
    }

    /// Runs `name` with `arguments`; `progress` receives the engine's progress reports.
    /// Dropping the returned future cancels the call.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        progress: mpsc::UnboundedSender<Progress>,
    ) -> Result<Output, Error> {
        let tools = Arc::clone(&self.tools);
        let name = name.to_owned();
        let (answer, answered) = oneshot::channel::<Result<Output, Error>>();
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let mut answer = answer;
                let report = move |p: Progress| {
                    let _ = progress.send(p);
                };
                let Some(tool) = tools.find(&name) else {
                    let _ = answer.send(Err(Error::internal(format!("no tool {name}"))));
                    return;
                };
                let call = tools.call(tool, arguments, &report);
                let mut call = std::pin::pin!(call);
                let result = tokio::select! {
                    result = &mut call => result,
                    // The request is gone: drop the call, cancelling its work.
                    () = answer.closed() => return,
                };
                let refill = Tools::refills_pool(tool, result.is_ok());
                let _ = answer.send(result);
                if refill {
                    // The reply is on its way. The refill (catalog transactions, a
                    // supervisor's fork and exec) runs on a thread of its own, in the next
                    // lull: the next call, which the client may send at once, neither queues
                    // behind it here nor shares the CPUs with it.
                    let tools = Arc::clone(&tools);
                    let runtime = tokio::runtime::Handle::current();
                    tokio::task::spawn_blocking(move || {
                        tools.wait_for_lull();
                        runtime.block_on(tools.refill_pool());
                    });
                }
            })
        });
        self.jobs
            .send(job)
            .map_err(|_| Error::internal("the MCP server is shutting down"))?;
        answered
            .await
            .unwrap_or_else(|_| Err(Error::internal("the tool call was abandoned")))
    }
}

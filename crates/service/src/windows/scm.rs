//! The service control manager: registering the service, starting and stopping it,
//! asking its state, and the entry point it calls.

use std::ffi::OsString;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agent_protocol::layout::AgentHome;
use windows_service::service::{
    ServiceAccess, ServiceAction, ServiceActionType, ServiceControl, ServiceControlAccept,
    ServiceErrorControl, ServiceExitCode, ServiceFailureActions, ServiceFailureResetPeriod,
    ServiceInfo, ServiceStartType, ServiceState, ServiceStatus, ServiceType,
};
use windows_service::service_control_handler::{self, ServiceControlHandlerResult};
use windows_service::service_manager::{ServiceManager, ServiceManagerAccess};
use windows_service::{define_windows_service, service_dispatcher};

use super::home;
use super::supervise::{Ended, Supervisor};

/// What a failed call says, with the system's own words and code (`windows_service`
/// alone says only "IO error in winapi call").
pub(crate) fn said(e: &windows_service::Error) -> String {
    match e {
        windows_service::Error::Winapi(io) => format!("{e}: {io}"),
        other => other.to_string(),
    }
}

fn manager(access: ServiceManagerAccess) -> windows_service::Result<ServiceManager> {
    ServiceManager::local_computer(None::<&str>, access)
}

/// Registers `name` to run `<home>\bin\agent-service.exe run` at boot.
pub(crate) fn install(name: &str, exe: &Path, home: &AgentHome) -> anyhow::Result<()> {
    let scm = manager(ServiceManagerAccess::CONNECT | ServiceManagerAccess::CREATE_SERVICE)?;
    let info = ServiceInfo {
        name: OsString::from(name),
        display_name: OsString::from(format!("Agent ({})", home.root().display())),
        service_type: ServiceType::OWN_PROCESS,
        start_type: ServiceStartType::AutoStart,
        error_control: ServiceErrorControl::Normal,
        executable_path: exe.to_path_buf(),
        launch_arguments: vec![
            OsString::from("run"),
            OsString::from("--service-name"),
            OsString::from(name),
        ],
        dependencies: vec![],
        account_name: None,
        account_password: None,
    };
    let service = scm
        .create_service(&info, ServiceAccess::CHANGE_CONFIG | ServiceAccess::START)
        .map_err(|e| anyhow::anyhow!("cannot register the service {name}: {}", said(&e)))?;
    let _ = service.set_description(DESCRIPTION);
    // The service restarts a crashed agent itself; these restart the service if it
    // crashes (Windows honours them; Wine ignores them).
    let actions = ServiceFailureActions {
        reset_period: ServiceFailureResetPeriod::After(Duration::from_secs(86_400)),
        reboot_msg: None,
        command: None,
        actions: Some(vec![
            ServiceAction {
                action_type: ServiceActionType::Restart,
                delay: Duration::from_secs(5),
            },
            ServiceAction {
                action_type: ServiceActionType::Restart,
                delay: Duration::from_secs(30),
            },
        ]),
    };
    // Said in service.log either way: Wine takes them and never shows or acts on them,
    // so the log is where a test (or an administrator under Wine) reads what was asked.
    match service.update_failure_actions(actions) {
        Ok(()) => home::log(home, &format!("recovery actions set: {RECOVERY}")),
        Err(e) => home::log(
            home,
            &format!("recovery actions not set ({e}); the service restarts the agent itself"),
        ),
    }
    Ok(())
}

/// What `sc qdescription` and the Services console show.
const DESCRIPTION: &str = "Runs the fleet's agent and its workload, restarts them when they crash, and updates them in place from the update server. Commands: <home>\\bin\\agent.exe status|lock|uninstall; net start|stop; sc query.";

/// The recovery actions [`install`] sets, in words (`sc qfailure` shows them on Windows).
const RECOVERY: &str = "restart the service after 5 s, again after 30 s, and after 30 s each time after; the count resets after a day";

/// Stops and removes the service `name`.
pub(crate) fn uninstall(name: &str) -> anyhow::Result<()> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(
            name,
            ServiceAccess::QUERY_STATUS | ServiceAccess::STOP | ServiceAccess::DELETE,
        )
        .map_err(|e| anyhow::anyhow!("no service {name}: {}", said(&e)))?;
    if service.query_status()?.current_state != ServiceState::Stopped {
        let _ = service.stop();
    }
    service.delete()?;
    Ok(())
}

/// The service's state and process, `None` when no service has that name.
pub(crate) fn state(name: &str) -> Option<(ServiceState, Option<u32>)> {
    let scm = manager(ServiceManagerAccess::CONNECT).ok()?;
    let service = scm.open_service(name, ServiceAccess::QUERY_STATUS).ok()?;
    let status = service.query_status().ok()?;
    Some((status.current_state, status.process_id))
}

/// Starts the service and waits (up to `within`) for it to run.
pub(crate) fn start(name: &str, within: Duration) -> anyhow::Result<()> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(name, ServiceAccess::QUERY_STATUS | ServiceAccess::START)
        .map_err(|e| anyhow::anyhow!("no service {name} ({}); install the agent with --install, or run agent-service.exe install", said(&e)))?;
    let end = Instant::now() + within;
    loop {
        let state = service.query_status()?.current_state;
        match state {
            ServiceState::Running | ServiceState::StartPending => return Ok(()),
            ServiceState::Stopped => match service.start::<&str>(&[]) {
                Ok(()) => return Ok(()),
                // The manager starts one service at a time and says its database is
                // locked meanwhile (at boot, or while another service starts), or the
                // process was slow to answer: try again while there is time.
                Err(e) if worth_again(&e) && Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e.into()),
            },
            // A stop (or a restart of itself) in progress: wait for it to finish.
            _ if Instant::now() < end => std::thread::sleep(Duration::from_millis(100)),
            other => anyhow::bail!("the service {name} stays {other:?}"),
        }
    }
}

/// A start worth trying again: the service manager is busy starting another service
/// (ERROR_SERVICE_DATABASE_LOCKED), or this one's process was too slow to connect to it
/// (ERROR_SERVICE_REQUEST_TIMEOUT, a loaded machine at boot).
fn worth_again(e: &windows_service::Error) -> bool {
    const ERROR_SERVICE_REQUEST_TIMEOUT: i32 = 1053;
    const ERROR_SERVICE_DATABASE_LOCKED: i32 = 1055;
    matches!(
        e,
        windows_service::Error::Winapi(io)
            if matches!(io.raw_os_error(), Some(ERROR_SERVICE_DATABASE_LOCKED | ERROR_SERVICE_REQUEST_TIMEOUT))
    )
}

/// Stops the service and waits (up to `within`) for it to have stopped.
pub(crate) fn stop(name: &str, within: Duration) -> anyhow::Result<()> {
    let scm = manager(ServiceManagerAccess::CONNECT)?;
    let service = scm
        .open_service(name, ServiceAccess::QUERY_STATUS | ServiceAccess::STOP)
        .map_err(|e| anyhow::anyhow!("no service {name}: {}", said(&e)))?;
    if service.query_status()?.current_state == ServiceState::Stopped {
        return Ok(());
    }
    let _ = service.stop();
    let end = Instant::now() + within;
    while service.query_status()?.current_state != ServiceState::Stopped {
        if Instant::now() >= end {
            anyhow::bail!(
                "the service {name} did not stop within {}s",
                within.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

static NAME: OnceLock<(String, AgentHome)> = OnceLock::new();

/// `agent-service.exe run`: hands this process to the service manager, which calls
/// [`service_main`] on a thread of its own.
pub(crate) fn run(name: String, home: AgentHome) -> anyhow::Result<()> {
    let _ = NAME.set((name.clone(), home));
    service_dispatcher::start(&name, ffi_service_main).map_err(|e| {
        anyhow::anyhow!("not started by the service manager ({e}); use agent-service.exe start")
    })
}

define_windows_service!(ffi_service_main, service_main);

fn service_main(_arguments: Vec<OsString>) {
    let Some((name, home)) = NAME.get().cloned() else {
        return;
    };
    if let Err(e) = serve(&name, &home) {
        home::log(&home, &format!("the service failed: {e:#}"));
    }
}

fn status(state: ServiceState, accept: ServiceControlAccept, code: u32) -> ServiceStatus {
    ServiceStatus {
        service_type: ServiceType::OWN_PROCESS,
        current_state: state,
        controls_accepted: accept,
        exit_code: ServiceExitCode::Win32(code),
        checkpoint: 0,
        wait_hint: Duration::from_secs(30),
        process_id: None,
    }
}

fn serve(name: &str, home: &AgentHome) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel();
    let handler = move |control| match control {
        // Who asked, for run\stop-requested: an updater judging a new version must know
        // that this stop was asked for (`net stop`, a shutdown), not a crash.
        ServiceControl::Stop => {
            let _ = tx.send("the service manager (service stop)");
            ServiceControlHandlerResult::NoError
        }
        ServiceControl::Shutdown => {
            let _ = tx.send("the service manager (shutdown)");
            ServiceControlHandlerResult::NoError
        }
        ServiceControl::Interrogate => ServiceControlHandlerResult::NoError,
        _ => ServiceControlHandlerResult::NotImplemented,
    };
    let handle = service_control_handler::register(name, handler)?;
    let mut supervisor = match Supervisor::new(home.clone(), name.to_owned()) {
        Ok(s) => s,
        Err(e) => {
            handle.set_service_status(status(
                ServiceState::Stopped,
                ServiceControlAccept::empty(),
                1,
            ))?;
            return Err(e);
        }
    };
    handle.set_service_status(status(
        ServiceState::Running,
        ServiceControlAccept::STOP | ServiceControlAccept::SHUTDOWN,
        0,
    ))?;
    let ended = supervisor.run(&rx);
    if ended == Ended::Stopped {
        handle.set_service_status(status(
            ServiceState::StopPending,
            ServiceControlAccept::empty(),
            0,
        ))?;
    }
    drop(supervisor);
    handle.set_service_status(status(
        ServiceState::Stopped,
        ServiceControlAccept::empty(),
        0,
    ))?;
    Ok(())
}

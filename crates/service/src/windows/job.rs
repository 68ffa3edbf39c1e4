//! The job object the agent runs in: closing it (the service ending, however it ends)
//! ends the agent, its workload and every child of theirs; the updater is started out of
//! it (breakaway), since it must outlive the agent and a restart of the service.

use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::process::Child;

use windows_sys::Win32::Foundation::HANDLE;
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_BREAKAWAY_OK,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JobObjectExtendedLimitInformation, SetInformationJobObject, TerminateJobObject,
};

/// The job, closed when dropped.
pub(crate) struct Job(OwnedHandle);

impl Job {
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: plain call; a null handle is checked.
        let handle = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if handle.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a handle just created here, owned by nothing else.
        let job = Self(unsafe { OwnedHandle::from_raw_handle(handle) });
        // SAFETY: plain data, zeroed as the API expects before the flags are set.
        let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
        limits.BasicLimitInformation.LimitFlags =
            JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_BREAKAWAY_OK;
        // SAFETY: a live job handle and a pointer to a struct of the size passed.
        let ok = unsafe {
            SetInformationJobObject(
                job.0.as_raw_handle(),
                JobObjectExtendedLimitInformation,
                (&raw const limits).cast(),
                std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
            )
        };
        if ok == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(job)
    }

    pub(crate) fn assign(&self, child: &Child) -> std::io::Result<()> {
        // SAFETY: a live job handle and the child's live process handle.
        let ok = unsafe {
            AssignProcessToJobObject(self.0.as_raw_handle(), child.as_raw_handle() as HANDLE)
        };
        if ok == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Ends every process in the job; the job stays usable.
    pub(crate) fn terminate(&self) {
        // SAFETY: a live job handle.
        unsafe { TerminateJobObject(self.0.as_raw_handle(), 1) };
    }
}

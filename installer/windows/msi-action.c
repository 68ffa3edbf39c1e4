/*
 * The MSI's custom action (installer/windows/agent.wxs): runs the command line in its
 * CustomActionData (the bundle and its arguments) and writes every line the bundle says
 * into the Windows Installer log, so that a failed install shows why (the server's words
 * when it refuses the enrollment token) where an administrator looks. An EXE custom
 * action's output goes nowhere; a DLL's MsiProcessMessage goes to the log.
 * Built by scripts/build-dist.sh with mingw:
 *   x86_64-w64-mingw32-gcc -shared -O2 -o msi-action.dll msi-action.c -lmsi
 * Returns ERROR_INSTALL_FAILURE when the bundle fails, which rolls the install back.
 */
#include <windows.h>
#include <msi.h>
#include <msiquery.h>

static void say(MSIHANDLE install, const char *utf8, int len) {
    wchar_t text[4096];
    int n = MultiByteToWideChar(CP_UTF8, 0, utf8, len, text, 4095);
    if (n <= 0) return;
    text[n] = 0;
    MSIHANDLE record = MsiCreateRecord(1);
    MsiRecordSetStringW(record, 0, L"agent-bundle: [1]");
    MsiRecordSetStringW(record, 1, text);
    MsiProcessMessage(install, INSTALLMESSAGE_INFO, record);
    MsiCloseHandle(record);
}

UINT __stdcall RunBundle(MSIHANDLE install) {
    wchar_t command[8192];
    DWORD size = sizeof command / sizeof command[0];
    if (MsiGetPropertyW(install, L"CustomActionData", command, &size) != ERROR_SUCCESS || size == 0) {
        say(install, "no command line in CustomActionData", -1);
        return ERROR_INSTALL_FAILURE;
    }
    SECURITY_ATTRIBUTES inherit = {sizeof inherit, NULL, TRUE};
    HANDLE readable, writable;
    if (!CreatePipe(&readable, &writable, &inherit, 0)) {
        say(install, "cannot make a pipe for the bundle's output", -1);
        return ERROR_INSTALL_FAILURE;
    }
    SetHandleInformation(readable, HANDLE_FLAG_INHERIT, 0);
    STARTUPINFOW startup = {sizeof startup};
    startup.dwFlags = STARTF_USESTDHANDLES;
    startup.hStdInput = INVALID_HANDLE_VALUE;
    startup.hStdOutput = writable;
    startup.hStdError = writable;
    PROCESS_INFORMATION process;
    if (!CreateProcessW(NULL, command, NULL, NULL, TRUE, CREATE_NO_WINDOW, NULL, NULL, &startup,
                        &process)) {
        CloseHandle(readable);
        CloseHandle(writable);
        say(install, "cannot run the bundle (agent-setup\\agent-bundle.exe)", -1);
        return ERROR_INSTALL_FAILURE;
    }
    CloseHandle(writable);
    /* Line by line into the log; a line longer than the buffer is said in pieces. */
    char line[2048];
    int used = 0;
    char chunk[1024];
    DWORD got;
    while (ReadFile(readable, chunk, sizeof chunk, &got, NULL) && got > 0) {
        for (DWORD i = 0; i < got; i++) {
            char c = chunk[i];
            if (c == '\n' || used == (int)sizeof line) {
                while (used > 0 && line[used - 1] == '\r') used--;
                if (used > 0) say(install, line, used);
                used = 0;
                if (c == '\n') continue;
            }
            line[used++] = c;
        }
    }
    if (used > 0) say(install, line, used);
    CloseHandle(readable);
    WaitForSingleObject(process.hProcess, INFINITE);
    DWORD code = 1;
    GetExitCodeProcess(process.hProcess, &code);
    CloseHandle(process.hProcess);
    CloseHandle(process.hThread);
    return code == 0 ? ERROR_SUCCESS : ERROR_INSTALL_FAILURE;
}

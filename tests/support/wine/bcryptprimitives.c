#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    for (; len > 0x40000000; data += 0x40000000, len -= 0x40000000)
        if (!SystemFunction036(data, 0x40000000)) return FALSE;
    return SystemFunction036(data, (ULONG)len) ? TRUE : FALSE;
}

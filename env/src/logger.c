/* The logger plug-ins are given (ncclDebugLogger_t is variadic, which
 * Rust cannot define): formats the message, then hands it to the host. */
#include <stdarg.h>
#include <stdio.h>

void rccl_plugin_log_sink(int level, unsigned long flags, const char *file, int line,
                          const char *message);

void rccl_plugin_logger(int level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt ? fmt : "", args);
    va_end(args);
    rccl_plugin_log_sink(level, flags, file, line, message);
}

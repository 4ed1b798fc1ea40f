/*
 * Preloaded before Debian's libfaketime 0.9.10 when the chaos suite runs a process
 * with a skewed clock (tests/chaos/skew.py).
 *
 * libfaketime fakes CLOCK_MONOTONIC too (by a constant offset: rate unchanged) and
 * translates the deadlines of the waits it wraps, but 0.9.10 does not wrap
 * sem_clockwait() or pthread_cond_clockwait(). CPython 3.11 waits on locks with
 * sem_clockwait(CLOCK_MONOTONIC, deadline): a deadline computed on the faked clock
 * would be ~56 years away for the kernel, so every lock/Event/Queue wait with a
 * timeout would hang. These wrappers move such a deadline onto the kernel's clock
 * (deadline - faked now + real now). Upstream libfaketime wraps sem_clockwait since
 * 0.9.11; Debian bookworm ships 0.9.10.
 *
 * librdkafka (as bundled with confluent-kafka) waits with glibc's C11 cnd_timedwait(),
 * whose CLOCK_REALTIME deadline libfaketime does not translate either: 2 s ahead, every
 * wait lasted 2 s longer (a 1 s consumer poll took 11 s); 2 s behind, waits spun.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

static struct timespec on_kernel_clock(clockid_t clock, const struct timespec *deadline)
{
    struct timespec faked, actual, out;
    clock_gettime(clock, &faked);                 /* through libfaketime */
    syscall(SYS_clock_gettime, clock, &actual);   /* the kernel's */
    long long ns = (long long)(deadline->tv_sec - faked.tv_sec + actual.tv_sec) * 1000000000LL
                   + (deadline->tv_nsec - faked.tv_nsec + actual.tv_nsec);
    if (ns < 0) ns = 0;
    out.tv_sec = (time_t)(ns / 1000000000LL);
    out.tv_nsec = (long)(ns % 1000000000LL);
    return out;
}

int sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *deadline)
{
    static int (*real)(sem_t *, clockid_t, const struct timespec *);
    if (real == NULL)
        real = (int (*)(sem_t *, clockid_t, const struct timespec *))dlsym(RTLD_NEXT, "sem_clockwait");
    struct timespec fixed = on_kernel_clock(clock, deadline);
    return real(sem, clock, &fixed);
}

int pthread_cond_clockwait(pthread_cond_t *cond, pthread_mutex_t *mutex, clockid_t clock,
                           const struct timespec *deadline)
{
    static int (*real)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
    if (real == NULL)
        real = (int (*)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *))
            dlsym(RTLD_NEXT, "pthread_cond_clockwait");
    struct timespec fixed = on_kernel_clock(clock, deadline);
    return real(cond, mutex, clock, &fixed);
}

int cnd_timedwait(cnd_t *cond, mtx_t *mutex, const struct timespec *deadline)
{
    static int (*real)(cnd_t *, mtx_t *, const struct timespec *);
    if (real == NULL)
        real = (int (*)(cnd_t *, mtx_t *, const struct timespec *))dlsym(RTLD_NEXT, "cnd_timedwait");
    struct timespec fixed = on_kernel_clock(CLOCK_REALTIME, deadline);
    return real(cond, mutex, &fixed);
}

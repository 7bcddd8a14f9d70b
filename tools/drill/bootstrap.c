/*
 * The drill's out-of-band channel, standing in for NCCL's bootstrap sockets: small
 * files in the scenario's private directory, each written whole under a temporary
 * name and renamed into place, so a reader sees either nothing or all of it.
 * Callers poll with their own deadlines; nothing here blocks.
 */
#include "tools/drill/drill.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t drill_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int drill_file_put(const char *dir, const char *name, int rank, const void *data, size_t len)
{
	char tmp[512], path[512];
	const char *p = data;
	int fd, err = 0;

	snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", dir, name, rank);
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			err = n < 0 ? -errno : -EIO;
			break;
		}
		p += n;
		len -= (size_t)n;
	}
	if (close(fd) != 0 && !err)
		err = -errno;
	if (!err && rename(tmp, path) != 0)
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

int drill_file_get(const char *dir, const char *name, int rank, void *data, size_t len)
{
	char path[512];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -EAGAIN : -errno;
	n = read(fd, data, len);
	close(fd);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EPROTO;
}

void drill_file_del(const char *dir, const char *name, int rank)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
	unlink(path);
}

bool drill_file_exists(const char *dir, const char *name, int rank)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
	return access(path, F_OK) == 0;
}

/*
 * The bootstrap interface of the control listener, chosen the way NCCL
 * chooses its own (NCCL_SOCKET_IFNAME), so that R2CC's control traffic takes
 * the path the administrator allowed for NCCL's. The pick works on a given
 * interface list so that the tests can hand it synthetic ones.
 */
#include "ctl/ctl_priv.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

bool r2cc_ctl_ifname_match(const char *spec, const char *name)
{
	bool exclude = false, exact = false;
	if (*spec == '^') {
		exclude = true;
		spec++;
	}
	if (*spec == '=') {
		exact = true;
		spec++;
	}
	bool hit = false;
	while (*spec && !hit) {
		const char *end = strchr(spec, ',');
		size_t n = end ? (size_t)(end - spec) : strlen(spec);
		if (n > 0)
			hit = exact ? (strlen(name) == n && !strncmp(name, spec, n))
				    : !strncmp(name, spec, n);
		spec += n + (end ? 1 : 0);
	}
	return exclude ? !hit : hit;
}

static bool usable(const struct ifaddrs *ifa, int family)
{
	if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != family || !(ifa->ifa_flags & IFF_UP))
		return false;
	if (family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)ifa->ifa_addr;
		if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr))
			return false;
	}
	return true;
}

static void take(const struct ifaddrs *ifa, struct sockaddr_storage *addr, char name[IF_NAMESIZE])
{
	memset(addr, 0, sizeof(*addr));
	memcpy(addr, ifa->ifa_addr,
	       ifa->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
						    : sizeof(struct sockaddr_in));
	strncpy(name, ifa->ifa_name, IF_NAMESIZE - 1);
	name[IF_NAMESIZE - 1] = '\0';
}

int r2cc_ctl_iface_pick(const struct ifaddrs *list, const char *spec, struct sockaddr_storage *addr,
			char name[IF_NAMESIZE])
{
	static const int families[] = {AF_INET, AF_INET6};
	if (spec && *spec) {
		for (int f = 0; f < 2; f++)
			for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next)
				if (usable(ifa, families[f]) &&
				    r2cc_ctl_ifname_match(spec, ifa->ifa_name)) {
					take(ifa, addr, name);
					return 0;
				}
		return -ENODEV;
	}
	for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next)
		if (usable(ifa, AF_INET) && !(ifa->ifa_flags & IFF_LOOPBACK)) {
			take(ifa, addr, name);
			return 0;
		}
	for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next)
		if (usable(ifa, AF_INET) && (ifa->ifa_flags & IFF_LOOPBACK)) {
			take(ifa, addr, name);
			return 0;
		}
	return -ENODEV;
}

int r2cc_ctl_iface_find(struct sockaddr_storage *addr, char name[IF_NAMESIZE])
{
	struct ifaddrs *list;
	if (getifaddrs(&list) != 0)
		return -errno;
	int rc = r2cc_ctl_iface_pick(list, getenv("NCCL_SOCKET_IFNAME"), addr, name);
	freeifaddrs(list);
	return rc;
}

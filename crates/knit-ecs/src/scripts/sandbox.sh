# shellcheck shell=sh
# The fake Cloud Assistant's instance: sets up the namespaces unshare gave
# it and runs the command's script. Run as `sh -c <this> sh <guest> <script>
# <drop|keep>`, its values as arguments (never spliced into this text):
#   $1  the instance's own files (tmp, vartmp, root, run, hostname)
#   $2  the script (opened before its /tmp hides the scratch directory)
#   $3  `drop` to become `nobody` on the host
set -e
g=$1
exec 3<"$2"
h=$(cat "$g/hostname")
mount --bind "$g/root" /root
mount --bind "$g/run" /run
mount --bind "$g/vartmp" /var/tmp
if [ -e /etc/hostname ]; then mount --bind "$g/hostname" /etc/hostname; fi
mount --bind "$g/tmp" /tmp
hostname "$h" 2>/dev/null || true
mount -t proc proc /proc 2>/dev/null || true
set +e
cd /root
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$3" = drop ]; then
  setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \
    env -i PATH=$path HOME=/root LANG=C.UTF-8 /bin/sh /dev/fd/3
else
  env -i PATH=$path HOME=/root LANG=C.UTF-8 /bin/sh /dev/fd/3
fi

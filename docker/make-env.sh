#!/bin/sh
# Writes docker/.env (mode 600) with a fresh random value for every secret docker/compose.yaml requires; an
# existing file is left as it is. Usage: sh docker/make-env.sh [path]   (default: .env beside this script)
set -eu
env_file=${1:-$(dirname "$0")/.env}
if [ -e "$env_file" ]; then
    echo "$env_file exists; left as it is" >&2
    exit 0
fi
secret() { openssl rand -hex 24; }
umask 077
cat > "$env_file" <<END
# Secrets of docker/compose.yaml, written by docker/make-env.sh. Keep this file out of version control.
POSTGRES_PASSWORD=$(secret)
S3_ACCESS_KEY_ID=hpd-$(openssl rand -hex 4)
S3_SECRET_ACCESS_KEY=$(secret)
AIRFLOW_FERNET_KEY=$(openssl rand -base64 32 | tr '+/' '-_')
AIRFLOW_JWT_SECRET=$(secret)
AIRFLOW_API_SECRET_KEY=$(secret)
AIRFLOW_ADMIN_USER=admin
AIRFLOW_ADMIN_PASSWORD=$(secret)
END
echo "wrote $env_file: sign in to http://127.0.0.1:8080 as admin with its AIRFLOW_ADMIN_PASSWORD" >&2

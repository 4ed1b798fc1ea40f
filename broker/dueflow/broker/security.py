"""SASL_SSL for the local broker: TLS material, SCRAM users, listener settings.

``dueflow broker start --security sasl_ssl`` gives the client port a
``SASL_SSL`` listener instead of ``PLAINTEXT``: TLS with a certificate for
127.0.0.1 and localhost, signed by a CA made for this broker, and SCRAM
logins (``SCRAM-SHA-512`` and ``SCRAM-SHA-256`` both enabled). What is made,
once, in the security directory (``<state dir>/security``, mode 0700; every
file with a secret in it mode 0600):

- ``ca.pem``: the CA certificate clients trust (``ssl.ca.location``). The
  CA's private key is deleted once it has signed the broker certificate, so
  nothing else can ever be signed with it.
- ``broker.keystore.p12`` / ``broker.truststore.p12``: the broker's key and
  certificate chain, and the CA, as PKCS12 stores (made with the JDK's
  ``keytool``, which writes what Java reads).
- ``client.password``: the generated password of the client user
  ``dueflow``; ``broker.secrets``: the stores' password and that of the
  broker's own user ``dueflow-broker``.

SCRAM credentials live in the KRaft metadata log, so they are written when
the storage is formatted (``StorageTool format --add-scram``); the format
command reads them from a java argument file (0600, removed after), so no
password is ever on a command line that ``ps`` shows. Brokers talk to each
other over the same SASL_SSL listener as user ``dueflow-broker``
(``SCRAM-SHA-512``); the KRaft controller listener stays ``PLAINTEXT`` on
127.0.0.1 (SCRAM cannot authenticate controllers: its credentials are in the
log the controllers serve). There is no authorizer: an authenticated user
may do anything.

The settings are pure functions (:func:`listener_properties`,
:func:`scram_format_args`, :func:`client_settings`, ...); making the files is
:func:`ensure_material`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dueflow.errors import BrokerError

PLAINTEXT = "plaintext"
SASL_SSL = "sasl_ssl"
SECURITY_MODES = (PLAINTEXT, SASL_SSL)

SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
CLIENT_MECHANISM = "SCRAM-SHA-512"
INTER_BROKER_MECHANISM = "SCRAM-SHA-512"
CLIENT_USER = "dueflow"
BROKER_USER = "dueflow-broker"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
CERT_DAYS = 825  # the longest validity every TLS client accepts for a server certificate

# Characters a password may not hold: it is quoted in a JAAS value and a SCRAM argument.
_UNQUOTABLE = frozenset('"\\\n\r')


@dataclass(frozen=True, slots=True)
class SecurityFiles:
    """The files of one broker's (or cluster's) TLS material and passwords."""

    root: Path

    @property
    def ca_pem(self) -> Path:
        return self.root / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.root / "broker.keystore.p12"

    @property
    def truststore(self) -> Path:
        return self.root / "broker.truststore.p12"

    @property
    def client_password(self) -> Path:
        return self.root / "client.password"

    @property
    def broker_secrets(self) -> Path:
        return self.root / "broker.secrets"

    @property
    def tls_files(self) -> tuple[Path, ...]:
        return (self.ca_pem, self.keystore, self.truststore)

    @property
    def password_files(self) -> tuple[Path, ...]:
        return (self.client_password, self.broker_secrets)


@dataclass(frozen=True, slots=True)
class BrokerSecrets:
    """The generated passwords (never in a repr)."""

    store_password: str = field(repr=False)
    broker_password: str = field(repr=False)
    client_password: str = field(repr=False)

    def values(self) -> tuple[str, ...]:
        return (self.store_password, self.broker_password, self.client_password)


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """What a node's ``server.properties`` needs for its SASL_SSL listener."""

    files: SecurityFiles
    secrets: BrokerSecrets


# ------------------------------------------------------------------ pure settings


def listener_properties(
    *, port: int, controller_port: int, security: ListenerSecurity | None = None
) -> dict[str, str]:
    """The listener settings of one node: ``PLAINTEXT`` on ``port`` (``security``
    None), or ``SASL_SSL`` with SCRAM there; the controller on ``controller_port``,
    ``PLAINTEXT``; all on 127.0.0.1 (pure)."""
    controller = f"CONTROLLER://127.0.0.1:{controller_port}"
    if security is None:
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
    files, pw = security.files, security.secrets
    # Every enabled mechanism needs a login config on the listener (the broker refuses
    # to start without); the broker logs in to the others with the inter-broker one.
    jaas = scram_jaas_config(BROKER_USER, pw.broker_password)
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},{controller}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        "sasl.mechanism.inter.broker.protocol": INTER_BROKER_MECHANISM,
        **{f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config": jaas for m in SCRAM_MECHANISMS},
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(files.keystore),
        "ssl.keystore.password": pw.store_password,
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(files.truststore),
        "ssl.truststore.password": pw.store_password,
        "ssl.client.auth": "none",
        # a broker connecting to another checks that its certificate names 127.0.0.1
        "ssl.endpoint.identification.algorithm": "https",
    }


def _check_quotable(what: str, text: str) -> None:
    if not text or _UNQUOTABLE & set(text):
        raise BrokerError(f"{what} must be non-empty, without quotes, backslashes or newlines")


def scram_jaas_config(user: str, password: str) -> str:
    """The ``sasl.jaas.config`` value a broker logs in to the others with (pure)."""
    _check_quotable("a SCRAM user name", user)
    _check_quotable("a SCRAM password", password)
    return f'{SCRAM_LOGIN_MODULE} required username="{user}" password="{password}";'


def scram_format_args(users: Mapping[str, str]) -> list[str]:
    """``--add-scram`` arguments of ``StorageTool format``: a credential for every user
    (name -> password) and every enabled mechanism (pure)."""
    args: list[str] = []
    for user, password in users.items():
        _check_quotable("a SCRAM user name", user)
        _check_quotable("a SCRAM password", password)
        if "," in user or "]" in user or "=" in user:
            raise BrokerError(f"SCRAM user name {user!r} may not hold ',', '=' or ']'")
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f'{mechanism}=[name={user},password="{password}"]']
    return args


def java_argfile(args: Sequence[str]) -> str:
    """A java launcher argument file (``java @file``) that holds ``args``: one per
    line, each in double quotes with ``\\`` and ``"`` escaped (pure)."""
    lines = []
    for arg in args:
        if "\n" in arg or "\r" in arg:
            raise BrokerError("a java argument may not hold a newline")
        lines.append('"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "\n".join(lines) + "\n"


def client_settings(files: SecurityFiles, password: str) -> dict[str, str]:
    """librdkafka settings of a client of the SASL_SSL listener (pure)."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": CLIENT_MECHANISM,
        "sasl.username": CLIENT_USER,
        "sasl.password": password,
        "ssl.ca.location": str(files.ca_pem),
    }


def env_name(key: str) -> str:
    """``DUEFLOW_KAFKA_<KEY>`` of librdkafka setting ``key`` (what dueflow's settings
    read back as ``key``, pure)."""
    return "DUEFLOW_KAFKA_" + key.upper().replace(".", "_")


def client_exports(*, bootstrap: str, files: SecurityFiles) -> list[str]:
    """Shell lines that give dueflow's processes the client settings; the password is
    read from its file when the line runs, never written out here (pure)."""
    shown = client_settings(files, password="")
    lines = [f"export DUEFLOW_BOOTSTRAP={shlex.quote(bootstrap)}"]
    for key, value in shown.items():
        if key == "sasl.password":
            read = f'"$(cat {shlex.quote(str(files.client_password))})"'
            lines.append(f"export {env_name(key)}={read}")
        else:
            lines.append(f"export {env_name(key)}={shlex.quote(value)}")
    return lines


def redact(text: str, hidden: Sequence[str]) -> str:
    """``text`` with every one of ``hidden`` replaced by ``[redacted]`` (pure)."""
    for value in sorted((h for h in hidden if h), key=len, reverse=True):
        text = text.replace(value, "[redacted]")
    return text


# ------------------------------------------------------------------------ files


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def read_secrets(files: SecurityFiles) -> BrokerSecrets:
    """The passwords made by :func:`ensure_material`."""
    try:
        doc = json.loads(files.broker_secrets.read_text())
        client = files.client_password.read_text().strip()
        return BrokerSecrets(doc["store_password"], doc["broker_password"], client)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BrokerError(
            f"cannot read the broker's passwords in {files.root} ({type(exc).__name__})"
        ) from None


def ensure_material(files: SecurityFiles, *, keytool: str, formatted: bool) -> BrokerSecrets:
    """The passwords and TLS material in ``files.root``, made where missing.

    Passwords are made only for storage not ``formatted`` yet (the SCRAM
    credentials are written when it is): a formatted broker whose password files
    are gone cannot be given new ones. The TLS files can always be made again
    (delete ``ca.pem`` to renew the certificates; clients read the new one).
    """
    _private_dir(files.root)
    have_passwords = all(p.exists() for p in files.password_files)
    if not have_passwords:
        if formatted:
            raise BrokerError(
                f"the broker was formatted with SCRAM credentials but its password files in "
                f"{files.root} are gone; stop it and start with a new --dir (or delete the "
                "state directory) to make new ones"
            )
        made = BrokerSecrets(
            store_password=secrets.token_urlsafe(24),
            broker_password=secrets.token_urlsafe(24),
            client_password=secrets.token_urlsafe(24),
        )
        write_private(
            files.broker_secrets,
            json.dumps(
                {"store_password": made.store_password, "broker_password": made.broker_password}
            ),
        )
        write_private(files.client_password, made.client_password + "\n")
        for p in files.tls_files:  # made for the old store password: made again
            p.unlink(missing_ok=True)
    found = read_secrets(files)
    if not all(p.exists() for p in files.tls_files):
        make_tls_material(files, keytool=keytool, store_password=found.store_password)
    return found


def make_tls_material(files: SecurityFiles, *, keytool: str, store_password: str) -> None:
    """A CA, a broker certificate for 127.0.0.1 and localhost signed by it, and the
    broker's PKCS12 keystore and truststore, with ``keytool``; the CA's key is dropped."""
    work = files.root / "tls.partial"
    shutil.rmtree(work, ignore_errors=True)
    _private_dir(work)
    env = {**os.environ, "DUEFLOW_STORE_PASSWORD": store_password}
    pw = ["-storepass:env", "DUEFLOW_STORE_PASSWORD"]
    ca, keystore, truststore = work / "ca.p12", work / "keystore.p12", work / "truststore.p12"
    ca_pem, csr, cert = work / "ca.pem", work / "broker.csr", work / "broker.pem"
    days = ["-validity", str(CERT_DAYS)]
    ec = ["-keyalg", "EC", "-groupname", "secp256r1"]
    steps: list[list[str]] = [
        ["-genkeypair", "-alias", "ca", *ec, "-dname", "CN=dueflow local broker CA", *days,
         "-ext", "bc:c", "-ext", "KU:c=keyCertSign,cRLSign",
         "-keystore", str(ca), "-storetype", "PKCS12", *pw],
        ["-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), *pw, "-file", str(ca_pem)],
        ["-genkeypair", "-alias", "broker", *ec, "-dname", "CN=localhost", *days,
         "-keystore", str(keystore), "-storetype", "PKCS12", *pw],
        ["-certreq", "-alias", "broker", "-keystore", str(keystore), *pw, "-file", str(csr)],
        ["-gencert", "-alias", "ca", "-keystore", str(ca), *pw, "-infile", str(csr),
         "-outfile", str(cert), "-rfc", *days,
         "-ext", "SAN=dns:localhost,ip:127.0.0.1",
         "-ext", "KU:c=digitalSignature,keyAgreement", "-ext", "EKU=serverAuth,clientAuth"],
        ["-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem),
         "-keystore", str(keystore), *pw],
        ["-importcert", "-alias", "broker", "-file", str(cert), "-keystore", str(keystore), *pw],
        ["-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem),
         "-keystore", str(truststore), "-storetype", "PKCS12", *pw],
    ]  # fmt: skip
    try:
        for step in steps:
            proc = subprocess.run(
                [keytool, *step], capture_output=True, text=True, env=env, check=False
            )
            if proc.returncode != 0:
                said = redact(f"{proc.stdout}\n{proc.stderr}".strip(), [store_password])
                raise BrokerError(f"keytool {step[0]} failed ({proc.returncode}): {said}")
        for made in (keystore, truststore, ca_pem):
            made.chmod(0o600 if made.suffix == ".p12" else 0o644)
        os.replace(keystore, files.keystore)
        os.replace(truststore, files.truststore)
        os.replace(ca_pem, files.ca_pem)  # last: its presence says the set is complete
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the CA's key goes with it


def keytool_for(java: str) -> str:
    """The ``keytool`` next to ``java`` (same JDK), else the one on PATH."""
    beside = Path(java).resolve().parent / "keytool"
    if beside.exists():
        return str(beside)
    found = shutil.which("keytool")
    if found is None:
        raise BrokerError("keytool (part of the JDK) is not on PATH: it makes the TLS material")
    return found


@contextlib.contextmanager
def private_argfile(path: Path, args: Sequence[str]) -> Iterator[Path]:
    """A java argument file with ``args`` (0600) that exists inside the block only."""
    write_private(path, java_argfile(args))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)

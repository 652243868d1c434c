"""`gpulab install-media --check`: upstream's own answer-parsing test files (pve-installer 9.2.7,
tests/unit/install/upstream) pass or are refused as upstream expects, each refusal for upstream's reason; the
spellings and types the answer format allows; and the command line's exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.install import answer

UPSTREAM = Path(__file__).parent / "upstream"
BASE_ENV = json.loads((UPSTREAM / "run-env-info.json").read_text())
UDEV = json.loads((UPSTREAM / "run-env-udev.json").read_text())

# upstream's failing answer -> the key gpulab names (upstream's expected message in the .json beside it)
REFUSED_FOR = {
    "both_password_and_hashed_set": "global.root-password",
    "btrfs_raid_single_disk": "disk-setup.disk-list",
    "duplicate_disk": "disk-setup.disk-list",
    "fqdn_from_dhcp_no_default_domain": "global.fqdn.domain",
    "fqdn_hostname_only": "global.fqdn",
    "ipv4_and_subnet_mask_33": "network.cidr",
    "lvm_swapsize_greater_than_hdsize": "disk-setup.lvm.swapsize",
    "network_interface_pinning_overlong_interface_name": (
        "network.interface-name-pinning.mapping.ab:cd:ef:12:34:56"
    ),
    "no_fqdn_from_dhcp": "global.fqdn.source",
    "no_root_password_set": "global.root-password-hashed",
    "short_password": "global.root-password",
    "zfs_raid_single_disk": "disk-setup.disk-list",
}


def run_env(folder: str, name: str) -> dict:
    """The runtime description upstream's test reads the answer in: its own, else the default one."""
    own = UPSTREAM / folder / f"{name}.run-env.json"
    return json.loads(own.read_text()) if own.exists() else BASE_ENV


def names(folder: str) -> list[str]:
    return sorted(p.stem for p in (UPSTREAM / folder).glob("*.toml"))


def test_every_upstream_file_is_covered() -> None:
    assert len(names("parse_answer")) == 19
    assert names("parse_answer_fail") == sorted(REFUSED_FOR)


@pytest.mark.parametrize("name", names("parse_answer"))
def test_upstream_accepted_answers_pass(name: str) -> None:
    text = (UPSTREAM / "parse_answer" / f"{name}.toml").read_text()
    assert answer.check_text(text, run_env("parse_answer", name), UDEV) == []


@pytest.mark.parametrize("name", names("parse_answer_fail"))
def test_upstream_refused_answers_are_refused_for_upstream_s_reason(name: str) -> None:
    text = (UPSTREAM / "parse_answer_fail" / f"{name}.toml").read_text()
    problems = answer.check_text(text, run_env("parse_answer_fail", name), UDEV)
    assert [p.key for p in problems][:1] == [REFUSED_FOR[name]], [str(p) for p in problems]
    expected = json.loads((UPSTREAM / "parse_answer_fail" / f"{name}.json").read_text())
    assert expected.get("error") or expected.get("parse-error")  # upstream refuses it too


def minimal(**changes: str) -> str:
    text = (UPSTREAM / "parse_answer" / "minimal.toml").read_text()
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    return text


def keys(text: str, env: dict | None = None, udev: dict | None = None) -> list[str]:
    return [p.key for p in answer.check_text(text, env, udev)]


def test_older_snake_case_spellings_are_read_and_both_spellings_at_once_are_refused() -> None:
    snake = minimal(**{'disk-list = ["sda"]': 'disk_list = ["sda"]', "root-password": "root_password"})
    assert keys(snake) == []
    both = minimal(**{'disk-list = ["sda"]': 'disk-list = ["sda"]\ndisk_list = ["sda"]'})
    problems = answer.check_text(both)
    assert [p.key for p in problems] == ["disk-setup.disk-list"] and "given twice" in problems[0].why


def test_unknown_keys_and_sections_are_refused_with_the_known_names() -> None:
    problems = answer.check_text(
        minimal(**{"[network]": "[network]\nsorce = 1", "[global]": "[globals]\n[global]"})
    )
    shown = {p.key: str(p) for p in problems}
    assert "network.sorce" in shown and "source, cidr" not in shown["network.sorce"]
    assert "globals" in shown and "disk-setup" in shown["globals"]


@pytest.mark.parametrize(
    ("old", "new", "key", "why"),
    [
        ('keyboard = "de"', 'keyboard = "german"', "global.keyboard", "not one of"),
        ('country = "at"', 'country = "AT"', "global.country", "two-letter"),
        ('timezone = "Europe/Vienna"', 'timezone = "Europe/Atlantis"', "global.timezone", "time zone"),
        ('mailto = "mail@no.invalid"', 'mailto = "mail@example.invalid"', "global.mailto", "placeholder"),
        ('mailto = "mail@no.invalid"', 'mailto = "nobody"', "global.mailto", "mail address"),
        ('filesystem = "ext4"', 'filesystem = "ntfs"', "disk-setup.filesystem", "not one of"),
        ('source = "from-dhcp"', 'source = "dhcp"', "network.source", "from-dhcp"),
        ('disk-list = ["sda"]', 'disk-list = "sda"', "disk-setup.disk-list", "list of strings"),
        ('disk-list = ["sda"]', 'disk-list = ["sda", "sdb"]', "disk-setup.disk-list", "one disk"),
        (
            'disk-list = ["sda"]',
            'disk-list = ["sda"]\nzfs.raid = "raid1"',
            "disk-setup.zfs",
            "another file system",
        ),
        ('fqdn = "pveauto.testinstall"', 'fqdn = "123.testinstall"', "global.fqdn", "only digits"),
    ],
)
def test_values_the_installer_refuses(old: str, new: str, key: str, why: str) -> None:
    problems = answer.check_text(minimal(**{old: new}))
    assert [p.key for p in problems] == [key], [str(p) for p in problems]
    assert why in problems[0].why


def test_raid_levels_count_their_disks() -> None:
    zfs = '[disk-setup]\nfilesystem = "zfs"\nzfs.raid = "{raid}"\ndisk-list = {disks}'
    base = minimal().split("[disk-setup]")[0]
    assert keys(base + zfs.format(raid="raidz-2", disks='["a", "b", "c", "d"]')) == []
    assert keys(base + zfs.format(raid="RAIDZ-3", disks='["a", "b", "c", "d"]')) == ["disk-setup.disk-list"]
    assert keys(base + zfs.format(raid="raid10", disks='["a", "b", "c", "d", "e"]')) == [
        "disk-setup.disk-list"
    ]
    assert keys(base + '[disk-setup]\nfilesystem = "zfs"\ndisk-list = ["a"]') == ["disk-setup.zfs.raid"]
    assert keys(base + zfs.format(raid="raid5", disks='["a"]')) == ["disk-setup.zfs.raid"]


def test_disks_of_the_machine_are_checked_only_with_its_runtime_description() -> None:
    text = minimal(**{'disk-list = ["sda"]': 'disk-list = ["nvme9n1"]'})
    assert keys(text) == []
    assert keys(text, BASE_ENV) == ["disk-setup.disk-list"]


def test_a_syntax_error_names_the_file() -> None:
    problems = answer.check_text("[global\nkeyboard = ")
    assert [p.key for p in problems] == ["(file)"] and "not valid TOML" in problems[0].why


def gpulab(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpulab.cli", *args], capture_output=True, text=True, env=env, check=False
    )


def test_the_command_line_check_exit_codes_and_messages(tmp_path: Path) -> None:
    good = gpulab("install-media", "--check", str(UPSTREAM / "parse_answer" / "zfs.toml"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "accepted by the answer format of proxmox/pve-installer 9.2.7" in good.stdout
    bad = gpulab(
        "install-media",
        "--check",
        str(UPSTREAM / "parse_answer_fail" / "no_fqdn_from_dhcp.toml"),
        "--run-env",
        str(UPSTREAM / "parse_answer_fail" / "no_fqdn_from_dhcp.run-env.json"),
    )
    assert bad.returncode == 1
    assert "global.fqdn.source='from-dhcp': the DHCP server did not provide a host name. Fix:" in bad.stdout
    missing = gpulab("install-media", "--check", str(tmp_path / "nope.toml"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr


def test_upstream_s_own_runtime_descriptions_are_all_there() -> None:
    # tests/parse-answer.rs reads these answers in their own run-env, not the default one
    own = sorted(f"{p.parent.name}/{p.name}" for p in UPSTREAM.glob("*/*.run-env.json"))
    assert own == [
        "parse_answer/no_network.run-env.json",
        "parse_answer_fail/fqdn_from_dhcp_no_default_domain.run-env.json",
        "parse_answer_fail/no_fqdn_from_dhcp.run-env.json",
    ]
    assert run_env("parse_answer", "no_network")["network"]["hostname"] == "no-gateways.test"


PINNING = (
    '[network.interface-name-pinning]\nenabled = {enabled}\nmapping = {{ "ab:cd:ef:12:34:56" = "{name}" }}\n'
)


def test_a_disabled_pinning_s_names_are_not_checked() -> None:
    # options.rs From<&NetworkInterfacePinningOptionsAnswer>: disabled, the mapping is dropped before verify()
    base = minimal()
    bad = PINNING.format(enabled="false", name="waytoolonginterfacename")
    assert keys(base + bad) == []
    assert keys(base + PINNING.format(enabled="true", name="waytoolonginterfacename")) == [
        "network.interface-name-pinning.mapping.ab:cd:ef:12:34:56"
    ]
    assert keys(base + PINNING.format(enabled="true", name="nic_1")) == []


FROM_ANSWER = (
    '[network]\nsource = "from-answer"\ncidr = "{cidr}"\ndns = "192.168.1.1"\ngateway = "192.168.1.1"\n'
    'filter.ID_NET_NAME_MAC = "*"\n'
)


@pytest.mark.parametrize(
    ("cidr", "refused"),
    [
        ("192.168.1.5/24", False),
        ("192.168.1.5", False),  # ip_address.rs Ipv4Cidr::from_str: no prefix is /32
        ("fd00::5/64", False),
        ("192.168.1.5/33", True),
        ("192.168.1.5/255.255.255.0", True),  # the prefix is parsed as a number only
        ("fe80::5%eth0/64", True),  # std's Ipv6Addr has no zone
    ],
)
def test_cidr_as_the_installer_reads_it(cidr: str, refused: bool) -> None:
    text = minimal().replace('[network]\nsource = "from-dhcp"\n', FROM_ANSWER.format(cidr=cidr))
    assert 'source = "from-answer"' in text
    assert keys(text) == (["network.cidr"] if refused else [])


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('mailto = "mail@no.invalid"', 'mailto = "mail@no.invalid\\n"', "global.mailto"),
        ('fqdn = "pveauto.testinstall"', 'fqdn = "pveauto.testinstall\\n"', "global.fqdn"),
    ],
)
def test_a_value_ending_in_a_newline_is_refused(old: str, new: str, key: str) -> None:
    # Rust's regex `$` is the end of the text; Python's `$` also matches before a final newline
    assert keys(minimal(**{old: new})) == [key]


def test_an_interface_name_ending_in_a_newline_is_refused() -> None:
    text = minimal() + PINNING.format(enabled="true", name="nic0\\n")
    assert keys(text) == ["network.interface-name-pinning.mapping.ab:cd:ef:12:34:56"]


@pytest.mark.parametrize(
    ("zone", "refused"),
    [("UTC", False), ("Asia/Kuala_Lumpur", False), ("Etc/UTC", True), ("US/Eastern", True)],
)
def test_time_zones_are_those_of_zone_tab_and_utc(zone: str, refused: bool) -> None:
    # country.pl builds the installer's cczones from zone.tab; verify_locale_settings adds UTC
    if not Path("/usr/share/zoneinfo/zone.tab").is_file():
        pytest.fail("tzdata's zone.tab is missing: install tzdata")
    text = minimal(**{'timezone = "Europe/Vienna"': f'timezone = "{zone}"'})
    assert keys(text) == (["global.timezone"] if refused else [])


def test_the_password_s_length_is_counted_in_bytes() -> None:
    # utils.rs: password.len() < ROOT_PASSWORD_MIN_LENGTH, and Rust's len() of a String is its UTF-8 bytes
    assert keys(minimal(**{'root-password = "12345678"': 'root-password = "äöüäöüä"'})) == []
    assert keys(minimal(**{'root-password = "12345678"': 'root-password = "1234567"'})) == [
        "global.root-password"
    ]


def test_the_nic_and_disk_filters_must_match_the_machine_s_devices() -> None:
    # utils.rs get_single_udev_index / get_matched_udev_indexes: "filter did not match any device(s)"
    nic = (UPSTREAM / "parse_answer" / "nic_matching.toml").read_text()
    assert keys(nic, udev=UDEV) == []
    absent = nic.replace('"*a0369f0ab382"', '"*00000000beef"')
    assert keys(absent) == []  # without the machine's udev properties, it cannot be known
    problems = answer.check_text(absent, BASE_ENV, UDEV)
    assert [p.key for p in problems] == ["network.filter"]
    assert "eno1 (" in problems[0].fix
    disks = (UPSTREAM / "parse_answer" / "disk_match_all.toml").read_text()
    assert keys(disks, udev=UDEV) == []
    # "all": one disk must match both; "any": one match of either is enough
    other = disks.replace(
        'filter.ID_SERIAL_SHORT = "S2HRNX0J403419"', 'filter.ID_SERIAL_SHORT = "NOSUCHDISK"'
    )
    assert keys(other, udev=UDEV) == ["disk-setup.filter"]
    assert keys(other.replace('filter-match = "all"', 'filter-match = "any"'), udev=UDEV) == []


def test_a_filter_key_a_device_lacks_does_not_count_against_it_with_all() -> None:
    devices = {"0": {"ID_SERIAL": "abc"}, "1": {"ID_SERIAL": "xyz", "ID_MODEL": "m"}}
    assert answer.udev_matches({"ID_SERIAL": "a*", "ID_MODEL": "q*"}, devices, match_all=True) == ["0"]
    assert answer.udev_matches({"ID_SERIAL": "a*", "ID_MODEL": "m"}, devices) == ["0", "1"]


def test_the_command_line_check_takes_the_machine_s_udev_properties(tmp_path: Path) -> None:
    absent = tmp_path / "answer.toml"
    text = (UPSTREAM / "parse_answer" / "nic_matching.toml").read_text()
    absent.write_text(text.replace('"*a0369f0ab382"', '"*00000000beef"'))
    proc = gpulab("install-media", "--check", str(absent), "--udev", str(UPSTREAM / "run-env-udev.json"))
    assert proc.returncode == 1 and "network.filter=" in proc.stdout, proc.stdout + proc.stderr
    assert gpulab("install-media", "--check", str(absent)).returncode == 0

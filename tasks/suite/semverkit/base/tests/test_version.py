import pytest

from semverkit import InvalidVersion, Version


def test_parse_full_version():
    v = Version.parse("1.4.0-rc.1+build.7")
    assert (v.major, v.minor, v.patch) == (1, 4, 0)
    assert v.prerelease == ("rc", "1")
    assert v.build == ("build", "7")
    assert v.is_prerelease


def test_parse_tolerates_v_prefix_and_whitespace():
    assert Version.parse(" v2.0.1 ") == Version(2, 0, 1)


def test_parse_rejects_invalid():
    for text in ["1.2", "1.2.3.4", "01.2.3", "1.2.3-", "1.2.3-01", "1.2.3+", "a.b.c", ""]:
        with pytest.raises(InvalidVersion):
            Version.parse(text)


def test_parse_requires_a_string():
    with pytest.raises(TypeError):
        Version.parse(1)


def test_constructor_validates_numbers():
    with pytest.raises(InvalidVersion):
        Version(1, -1, 0)


def test_coerce():
    assert Version.coerce("v2.1") == Version(2, 1, 0)
    assert Version.coerce("release-3") == Version(3, 0, 0)
    assert Version.coerce("1.2.3-beta") == Version(1, 2, 3)
    with pytest.raises(InvalidVersion):
        Version.coerce("none")


def test_str_and_repr_roundtrip():
    for text in ("0.0.0", "1.2.3-alpha.1", "1.2.3+exp.sha.5114f85", "1.0.0-x-y.7+z"):
        assert str(Version.parse(text)) == text
    assert repr(Version.parse("1.2.3")) == "Version('1.2.3')"


def test_ordering_of_numbers():
    assert Version.parse("1.10.0") > Version.parse("1.9.3")
    assert Version.parse("2.0.0") > Version.parse("1.99.99")


def test_prerelease_sorts_before_release():
    assert Version.parse("1.0.0-rc.1") < Version.parse("1.0.0")
    assert Version.parse("1.0.0") < Version.parse("1.0.1-alpha")


def test_prerelease_alphabetical_ordering():
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0-beta")
    assert Version.parse("1.0.0-beta") < Version.parse("1.0.0-rc")


def test_compare():
    assert Version.parse("1.2.3").compare(Version.parse("1.2.4")) == -1
    assert Version.parse("1.2.4").compare(Version.parse("1.2.3")) == 1
    assert Version.parse("1.2.3+a").compare(Version.parse("1.2.3+b")) == 0


@pytest.mark.parametrize(
    "start, part, expected",
    [
        ("1.2.3", "major", "2.0.0"),
        ("1.2.3", "minor", "1.3.0"),
        ("1.2.3", "patch", "1.2.4"),
        ("1.2.3", "prerelease", "1.2.4-rc.1"),
        ("1.2.4-rc.1", "prerelease", "1.2.4-rc.2"),
        ("1.3.0-rc.1", "minor", "1.3.0"),
        ("2.0.0-beta", "major", "2.0.0"),
        ("1.2.4-beta", "prerelease", "1.2.4-beta.1"),
    ],
)
def test_bump(start, part, expected):
    assert str(Version.parse(start).bump(part)) == expected


def test_bump_unknown_part():
    with pytest.raises(ValueError, match="unknown part"):
        Version(1).bump("build")


def test_release_drops_prerelease_and_build():
    assert Version.parse("1.2.3-rc.1+b5").release == Version(1, 2, 3)

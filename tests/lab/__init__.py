"""Tests that start a lab: labsim servers, network namespaces, sshd, playbook runs on lab hosts (`make lab`)."""

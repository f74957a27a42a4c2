"""The minimal rlserve client: step your own CartPole and let the server choose and learn.

Start a server first (in another terminal)::

    rlserve serve --spaces-from CartPole-v1

then run ``python examples/cartpole_client.py``. Replace the gymnasium env with your simulator:
the client only needs an observation before each decision and the reward after it. Restart the
server (``rlserve serve --resume runs/<name>``) while this runs: the client reconnects by itself,
and an episode the restarted server no longer knows raises ``EpisodeLostError``, so the loop
starts the next one.
"""

import argparse

import gymnasium as gym

from rlserve import EpisodeLostError, PolicyClient


def main() -> None:
    """Run episodes against the server and print each return."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", default="localhost:9900", help="the server's binary port")
    parser.add_argument("--token", default=None, help="the server's --token, if it has one")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument(
        "--inference",
        choices=["local", "remote"],
        default="local",
        help="local: the client chooses actions with numpy; remote: the server chooses every one",
    )
    args = parser.parse_args()

    env = gym.make("CartPole-v1")
    with PolicyClient(args.address, inference_mode=args.inference, token=args.token) as client:
        for episode in range(args.episodes):
            episode_id = client.start_episode()
            obs, _ = env.reset(seed=episode)
            episode_return, done = 0.0, False
            try:
                while not done:
                    action = client.get_action(episode_id, obs)
                    obs, reward, terminated, truncated, info = env.step(action)
                    client.log_returns(episode_id, float(reward), info=info)
                    episode_return += float(reward)
                    done = terminated or truncated
                # truncated=True: a time limit, not a failure; the learner bootstraps from obs.
                client.end_episode(episode_id, obs, truncated=truncated and not terminated)
            except EpisodeLostError:
                # The server restarted and forgot this episode: start the next one.
                print(f"episode {episode}: lost in a server restart")
                continue
            print(f"episode {episode}: return {episode_return:.0f}")


if __name__ == "__main__":
    main()
